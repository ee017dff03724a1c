package org.samm.gateway;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * Immutable job list shared (read-only) by many simulations.
 * Wire format (little-endian): int32 n, float64 arrival_s[n], float64 length_mi[n],
 * int32 cores[n], float64 ram_gb[n].
 */
public final class Workload {
    public final int n;
    public final double[] arrival;
    public final double[] lengthMi;
    public final int[] cores;
    public final double[] ramGb;

    Workload(double[] arrival, double[] lengthMi, int[] cores, double[] ramGb) {
        this.n = arrival.length;
        this.arrival = arrival;
        this.lengthMi = lengthMi;
        this.cores = cores;
        this.ramGb = ramGb;
        validate();
    }

    public static Workload of(double[] arrival, double[] lengthMi, int[] cores, double[] ramGb) {
        if (lengthMi.length != arrival.length || cores.length != arrival.length || ramGb.length != arrival.length) {
            throw new IllegalArgumentException("workload arrays differ in length");
        }
        return new Workload(arrival.clone(), lengthMi.clone(), cores.clone(), ramGb.clone());
    }

    public static Workload unpack(byte[] packed) {
        if (packed == null || packed.length < 4) {
            throw new IllegalArgumentException("workload bytes too short: need at least 4 bytes (int32 n)");
        }
        final ByteBuffer b = ByteBuffer.wrap(packed).order(ByteOrder.LITTLE_ENDIAN);
        final int n = b.getInt();
        if (n < 0) {
            throw new IllegalArgumentException("workload n must be >= 0, got " + n);
        }
        final long expected = 4L + 28L * n;
        if (packed.length != expected) {
            throw new IllegalArgumentException("workload bytes: expected " + expected + " bytes for n=" + n
                + ", got " + packed.length);
        }
        final double[] arrival = new double[n];
        final double[] length = new double[n];
        final int[] cores = new int[n];
        final double[] ram = new double[n];
        b.asDoubleBuffer().get(arrival);
        b.position(b.position() + 8 * n);
        b.asDoubleBuffer().get(length);
        b.position(b.position() + 8 * n);
        b.asIntBuffer().get(cores);
        b.position(b.position() + 4 * n);
        b.asDoubleBuffer().get(ram);
        return new Workload(arrival, length, cores, ram);
    }

    public byte[] pack() {
        final ByteBuffer b = ByteBuffer.allocate(4 + 28 * n).order(ByteOrder.LITTLE_ENDIAN);
        b.putInt(n);
        for (double v : arrival) b.putDouble(v);
        for (double v : lengthMi) b.putDouble(v);
        for (int v : cores) b.putInt(v);
        for (double v : ramGb) b.putDouble(v);
        return b.array();
    }

    private void validate() {
        double prev = Double.NEGATIVE_INFINITY;
        for (int j = 0; j < n; j++) {
            final double a = arrival[j];
            if (!(a >= 0) || Double.isInfinite(a)) {
                throw new IllegalArgumentException("job " + j + ": arrival_s must be finite and >= 0, got " + a);
            }
            if (a < prev) {
                throw new IllegalArgumentException("jobs must be sorted by arrival: job " + j + " arrives at " + a
                    + " before job " + (j - 1) + " at " + prev);
            }
            prev = a;
            if (!(lengthMi[j] > 0) || Double.isInfinite(lengthMi[j])) {
                throw new IllegalArgumentException("job " + j + ": length_mi must be finite and > 0, got " + lengthMi[j]);
            }
            if (cores[j] < 1) {
                throw new IllegalArgumentException("job " + j + ": cores must be >= 1, got " + cores[j]);
            }
            if (!(ramGb[j] >= 0) || Double.isInfinite(ramGb[j])) {
                throw new IllegalArgumentException("job " + j + ": ram_gb must be finite and >= 0, got " + ramGb[j]);
            }
        }
    }

    /**
     * The paper's synthetic workload (1551 jobs): 21 batches every 480 s from t=1800 s, the first 10
     * of 100 jobs and the next 11 of 50, each 1 core x 360 s at 4400 MIPS, plus a 1 s sentinel at 13680 s.
     */
    public static Workload paper() {
        final int n = 1551;
        final double[] arrival = new double[n];
        final double[] length = new double[n];
        final int[] cores = new int[n];
        final double[] ram = new double[n];
        int j = 0;
        for (int b = 0; b < 21; b++) {
            final int size = b < 10 ? 100 : 50;
            for (int k = 0; k < size; k++, j++) {
                arrival[j] = 1800.0 + 480.0 * b;
                length[j] = 360.0 * 4400.0;
                cores[j] = 1;
                ram[j] = 0.5;
            }
        }
        arrival[j] = 13680.0;
        length[j] = 4400.0;
        cores[j] = 1;
        ram[j] = 0.5;
        return new Workload(arrival, length, cores, ram);
    }
}
