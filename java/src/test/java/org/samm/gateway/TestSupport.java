package org.samm.gateway;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

final class TestSupport {
    private TestSupport() {
    }

    static String config(int initS, int initM, int initL, double cooldown, int threads) {
        return config(initS, initM, initL, cooldown, threads, 45, 97);
    }

    static String config(int initS, int initM, int initL, double cooldown, int threads, double bootMin, double bootMax) {
        return "{\"vm_types\": ["
            + "{\"name\": \"S\", \"cores\": 2, \"ram_gb\": 8, \"price_per_hour\": 0.2, \"min\": 1, \"max\": 10, \"initial\": " + initS + "},"
            + "{\"name\": \"M\", \"cores\": 4, \"ram_gb\": 16, \"price_per_hour\": 0.4, \"min\": 0, \"max\": 10, \"initial\": " + initM + "},"
            + "{\"name\": \"L\", \"cores\": 8, \"ram_gb\": 32, \"price_per_hour\": 0.8, \"min\": 0, \"max\": 10, \"initial\": " + initL + "}],"
            + "\"host_mips\": 4400, \"step_seconds\": 60, \"boot_delay_min_s\": " + bootMin + ", \"boot_delay_max_s\": " + bootMax + ","
            + "\"cooldown_s\": " + cooldown + ", \"threads\": " + threads + "}";
    }

    static byte[] resetRequest(int[] envs, long[] seeds) {
        final ByteBuffer b = ByteBuffer.allocate(4 + 12 * envs.length).order(ByteOrder.LITTLE_ENDIAN);
        b.putInt(envs.length);
        for (int i = 0; i < envs.length; i++) {
            b.putInt(envs[i]).putLong(seeds[i]);
        }
        return b.array();
    }

    static double[] doubles(String base64) {
        return doubles(java.util.Base64.getDecoder().decode(base64));
    }

    static double[] doubles(byte[] bytes) {
        final double[] d = new double[bytes.length / 8];
        ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN).asDoubleBuffer().get(d);
        return d;
    }
}
