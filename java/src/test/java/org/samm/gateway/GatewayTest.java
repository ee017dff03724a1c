package org.samm.gateway;

import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.SplittableRandom;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.samm.gateway.TestSupport.config;
import static org.samm.gateway.TestSupport.doubles;
import static org.samm.gateway.TestSupport.resetRequest;

class GatewayTest {
    static final int T = 3;
    static final int V = 30;
    static final int H = Config.HEADER_DOUBLES;
    static final int R = H + 4 * T + 5 * V;

    static Gateway gw;
    static int paperId;

    @BeforeAll
    static void setUp() {
        Logging.configure(false);
        gw = new Gateway();
        paperId = gw.loadWorkload(Workload.paper().pack());
    }

    /** Totals of one episode run with a fixed action row until termination (or a cap). */
    record Episode(int steps, double cost, double waitJobSec, double busyCoreSec, double[] last, double[] jobStats) {
    }

    static Episode runEpisode(String cfg, int workloadId, long seed, byte[] actionRow, int cap) {
        final int b = gw.createBatch(cfg, workloadId, 1);
        try {
            double[] s = doubles(gw.reset(b, resetRequest(new int[]{0}, new long[]{seed})));
            int steps = 0;
            double cost = 0, wait = 0, busy = 0;
            while (s[2] == 0 && steps < cap) {
                s = doubles(gw.step(b, actionRow));
                steps++;
                cost += s[11];
                wait += s[12];
                busy += s[14];
            }
            return new Episode(steps, cost, wait, busy, s, doubles(gw.jobStats(b, 0)));
        } finally {
            gw.closeBatch(b);
        }
    }

    @Test
    void pingNamesVersions() {
        assertTrue(gw.ping().startsWith("samm-gateway "));
        assertTrue(gw.ping().endsWith(" cloudsimplus 8.5.7"));
    }

    @Test
    void goldenRunFullFleetNoWaiting() {
        final Episode e = runEpisode(config(10, 10, 10, 0, 1), paperId, 42, new byte[T], 5000);
        System.out.printf("golden 10/10/10: steps=%d cost=%.6f $ wait=%.3f job-s busy=%.1f core-s%n",
            e.steps, e.cost, e.waitJobSec, e.busyCoreSec);
        assertTrue(e.steps == 229 || e.steps == 230, "steps " + e.steps);
        assertEquals(1.0, e.last[2]);
        assertEquals(0.0, e.waitJobSec, 1e-9);
        assertEquals(14.0 * e.steps * 60 / 3600, e.cost, 0.005);
        assertEquals(1551, e.last[9]);
        assertEquals(1551, e.last[5]);
        // total work = 1550 x 360 + 1 core-seconds
        assertEquals(1550 * 360.0 + 1.0, e.busyCoreSec, 1.0);
        checkJobs(e.jobStats, 0);
    }

    /** Every job ran once to completion for exactly its length (tolerance 0.1 s). */
    static void checkJobs(double[] js, int expectedRestarts) {
        final Workload w = Workload.paper();
        int restarts = 0;
        for (int j = 0; j < w.n; j++) {
            final double start = js[j * 5 + 1], fin = js[j * 5 + 2];
            assertTrue(start >= w.arrival[j], "job " + j + " started before arrival");
            assertTrue(fin > 0, "job " + j + " not finished");
            assertEquals(w.lengthMi[j] / 4400.0, fin - start, 0.1, "job " + j + " duration");
            assertEquals(start - w.arrival[j] >= 0 ? js[j * 5 + 3] : -1, js[j * 5 + 3], 1e-6);
            restarts += (int) js[j * 5 + 4];
        }
        if (expectedRestarts >= 0) {
            assertEquals(expectedRestarts, restarts);
        }
    }

    @Test
    void smallFleetLongRunWithLargeWaiting() {
        final Episode e = runEpisode(config(1, 1, 1, 0, 1), paperId, 42, new byte[T], 20000);
        System.out.printf("golden 1/1/1: steps=%d cost=%.6f $ wait=%.3f job-s busy=%.1f core-s%n",
            e.steps, e.cost, e.waitJobSec, e.busyCoreSec);
        assertEquals(1.0, e.last[2]);
        assertTrue(e.steps > 600, "steps " + e.steps);
        assertTrue(e.waitJobSec > 1e6, "wait " + e.waitJobSec);
        assertEquals(1.4 * e.steps * 60 / 3600, e.cost, 0.005);
        // per-job waits add up to the integral
        double sumWait = 0;
        for (int j = 0; j < 1551; j++) sumWait += e.jobStats[j * 5 + 3];
        assertEquals(e.waitJobSec, sumWait, 1e-6 * e.waitJobSec);
        checkJobs(e.jobStats, 0);
    }

    @Test
    void sameSeedSameBytesDifferentSeedDiffers() {
        final String cfg = config(1, 1, 1, 0, 1);
        final byte[][] a = randomRun(cfg, 7, 300, 3);
        final byte[][] b = randomRun(cfg, 7, 300, 3);
        final byte[][] c = randomRun(cfg, 8, 300, 3);
        boolean differs = false;
        for (int s = 0; s < a.length; s++) {
            assertArrayEquals(a[s], b[s], "step " + s);
            differs |= !Arrays.equals(a[s], c[s]);
        }
        assertTrue(differs, "a different seed should change boot delays");
        // all envs of the batch got the same seed: identical to each other
        final double[] last = doubles(a[a.length - 1]);
        for (int i = 1; i < 3; i++) {
            assertArrayEquals(Arrays.copyOfRange(last, 0, R), Arrays.copyOfRange(last, i * R, (i + 1) * R));
        }
    }

    /** Steps a batch of nEnvs envs (all with the same seed) with seeded random actions; returns every reply. */
    static byte[][] randomRun(String cfg, long seed, int steps, int nEnvs) {
        final int b = gw.createBatch(cfg, paperId, nEnvs);
        try {
            final int[] idx = new int[nEnvs];
            final long[] seeds = new long[nEnvs];
            for (int i = 0; i < nEnvs; i++) {
                idx[i] = i;
                seeds[i] = seed;
            }
            gw.reset(b, resetRequest(idx, seeds));
            final SplittableRandom r = new SplittableRandom(99);
            final byte[][] out = new byte[steps][];
            for (int s = 0; s < steps; s++) {
                final byte[] row = new byte[T];
                for (int k = 0; k < T; k++) {
                    final double u = r.nextDouble();
                    row[k] = (byte) (u < 0.1 ? -1 : u < 0.2 ? 1 : 0);
                }
                final byte[] act = new byte[nEnvs * T];
                for (int i = 0; i < nEnvs; i++) System.arraycopy(row, 0, act, i * T, T);
                out[s] = java.util.Base64.getDecoder().decode(gw.step(b, act));
            }
            return out;
        } finally {
            gw.closeBatch(b);
        }
    }

    @Test
    void parallelEqualsSequential() {
        final int nEnvs = 8, steps = 500;
        final byte[] actions = new byte[steps * nEnvs * T];
        final SplittableRandom r = new SplittableRandom(5);
        for (int i = 0; i < actions.length; i++) {
            final double u = r.nextDouble();
            actions[i] = (byte) (u < 0.08 ? -1 : u < 0.16 ? 1 : u < 0.17 ? 3 : 0);
        }
        final byte[][] seq = batchLoop(config(1, 1, 1, 0, 1), nEnvs, steps, actions);
        final byte[][] par = batchLoop(config(1, 1, 1, 0, 4), nEnvs, steps, actions);
        for (int s = 0; s < steps; s++) {
            assertArrayEquals(seq[s], par[s], "step " + s);
        }
    }

    /** The bench loop rule (env i seeded seed+i, re-seeded i + nEnvs*k on termination), keeping every reply. */
    static byte[][] batchLoop(String cfg, int nEnvs, int steps, byte[] actions) {
        final int b = gw.createBatch(cfg, paperId, nEnvs);
        try {
            final long seed = 1000;
            final int[] idx = new int[nEnvs];
            final long[] seeds = new long[nEnvs];
            for (int i = 0; i < nEnvs; i++) {
                idx[i] = i;
                seeds[i] = seed + i;
            }
            gw.reset(b, resetRequest(idx, seeds));
            final int[] ended = new int[nEnvs];
            final byte[][] out = new byte[steps][];
            for (int s = 0; s < steps; s++) {
                out[s] = java.util.Base64.getDecoder().decode(gw.step(b, Arrays.copyOfRange(actions, s * nEnvs * T, (s + 1) * nEnvs * T)));
                final double[] d = doubles(out[s]);
                for (int i = 0; i < nEnvs; i++) {
                    if (d[i * R + 2] == 1) {
                        ended[i]++;
                        gw.reset(b, resetRequest(new int[]{i}, new long[]{seed + i + (long) nEnvs * ended[i]}));
                    }
                }
            }
            return out;
        } finally {
            gw.closeBatch(b);
        }
    }

    @Test
    void cooldownBlocksThenReleases() {
        final int b = gw.createBatch(config(1, 1, 1, 180, 1), paperId, 1);
        try {
            double[] s = doubles(gw.reset(b, resetRequest(new int[]{0}, new long[]{3})));
            assertEquals(R, s.length);
            assertEquals(0.0, s[4]);
            final byte[] add = {1, 0, 0};
            s = doubles(gw.step(b, add)); // t0 = 0: applied
            assertEquals(1.0, s[3]);
            assertEquals(1.0, s[4]);
            assertEquals(2, s[H] + s[H + 1]);
            s = doubles(gw.step(b, add)); // t0 = 60: blocked
            assertEquals(0.0, s[3]);
            assertEquals(1.0, s[4]);
            assertEquals(2, s[H] + s[H + 1]);
            s = doubles(gw.step(b, new byte[]{0, -1, 0})); // t0 = 120: blocked (removals too)
            assertEquals(0.0, s[3]);
            assertEquals(0.0, s[4], "t1=180 is not < 0+180: the next action is allowed");
            assertEquals(1, s[H + 4] + s[H + 5]);
            s = doubles(gw.step(b, add)); // t0 = 180: allowed again
            assertEquals(1.0, s[3]);
            assertEquals(1.0, s[4]);
            assertEquals(3, s[H] + s[H + 1]);
            s = doubles(gw.step(b, new byte[T])); // no action: not applied, still cooling down
            assertEquals(0.0, s[3]);
            assertEquals(1.0, s[4]);
        } finally {
            gw.closeBatch(b);
        }
    }

    @Test
    void minMaxNeverCrossed() {
        final int b = gw.createBatch(config(1, 1, 1, 0, 1), paperId, 1);
        try {
            gw.reset(b, resetRequest(new int[]{0}, new long[]{11}));
            double[] s = doubles(gw.step(b, new byte[]{127, 127, 127}));
            assertEquals(1.0, s[3]);
            for (int i = 0; i < T; i++) {
                assertEquals(10, s[H + 4 * i] + s[H + 1 + 4 * i], "type " + i);
                assertEquals(0.0, s[H + 2 + 4 * i]); // can_add
                assertEquals(1.0, s[H + 3 + 4 * i]); // can_remove
            }
            s = doubles(gw.step(b, new byte[]{5, 1, 1}));
            assertEquals(0.0, s[3], "nothing can be added at max");
            // all 30 slots used, in creation order (types 0,1,2 initial, then 9 S, 9 M, 9 L)
            for (int j = 0; j < V; j++) {
                assertTrue(s[H + 4 * T + 5 * j] >= 0);
            }
            s = doubles(gw.step(b, new byte[]{-128, -128, -128}));
            assertEquals(1.0, s[3]);
            assertEquals(1, s[H] + s[H + 1]);
            assertEquals(0, s[H + 4] + s[H + 5]);
            assertEquals(0, s[H + 8] + s[H + 9]);
            assertEquals(0.0, s[H + 3]); // S at min: can_remove = 0
            assertEquals(1.0, s[H + 2]);
            s = doubles(gw.step(b, new byte[]{-1, -1, -1}));
            assertEquals(0.0, s[3]);
            assertEquals(1, s[H] + s[H + 1]);
            // empty slots last
            assertEquals(0.0, s[H + 4 * T]);
            assertEquals(-1.0, s[H + 4 * T + 5]);
        } finally {
            gw.closeBatch(b);
        }
    }

    @Test
    void removingBusyVmRequeuesItsJobs() {
        final int b = gw.createBatch(config(1, 1, 1, 0, 1), paperId, 1);
        try {
            double[] s = doubles(gw.reset(b, resetRequest(new int[]{0}, new long[]{5})));
            // the initial S, M, L slots
            assertEquals(0.0, s[H + 4 * T]);
            assertEquals(1.0, s[H + 4 * T + 1]);
            assertEquals(1.0, s[H + 4 * T + 5]);
            assertEquals(2.0, s[H + 4 * T + 10]);
            double waitSum = 0, busySum = 0;
            for (int k = 0; k < 31; k++) { // up to t = 1860: batch 1 arrived at 1800, 14 jobs running
                s = doubles(gw.step(b, new byte[T]));
                waitSum += s[12];
                busySum += s[14];
            }
            assertEquals(1860.0, s[0]);
            assertEquals(14, s[10]);
            assertEquals(86, s[7]);
            final double ramL = s[H + 4 * T + 10 + 3];
            assertEquals(8 * 0.5, ramL, 1e-9);
            assertEquals(1.0, s[H + 4 * T + 10 + 2], 1e-9, "the L VM is fully busy");
            assertEquals(86, s[16], "queued cores");
            assertEquals(14, s[17], "running cores");
            assertEquals(1, s[18], "head-of-line job cores");
            assertEquals(0, s[19], "no free core on any running VM");
            assertEquals(-1.0, s[20], "no action applied yet");
            s = doubles(gw.step(b, new byte[]{0, 0, -1})); // remove the L VM (8 running jobs, 60 s each)
            waitSum += s[12];
            busySum += s[14];
            assertEquals(1.0, s[3]);
            assertEquals(8, s[13]);
            assertEquals(8 * 60.0, s[15], 1e-6);
            assertEquals(6, s[10]);
            assertEquals(94, s[7]); // 86 + 8 re-queued
            assertEquals(94, s[16], "queued cores include the re-queued jobs");
            assertEquals(60.0, s[20], 1e-9, "seconds since the applied removal");
            assertEquals(0, s[H + 8] + s[H + 9]);
            while (s[2] == 0) {
                s = doubles(gw.step(b, new byte[T]));
                waitSum += s[12];
                busySum += s[14];
            }
            assertEquals(1551, s[9]);
            assertEquals(8, s[13]);
            final double[] js = doubles(gw.jobStats(b, 0));
            checkJobs(js, 8);
            double jobWait = 0, jobWork = 0;
            for (int j = 0; j < 1551; j++) {
                jobWait += js[j * 5 + 3];
                jobWork += js[j * 5 + 2] - js[j * 5 + 1];
            }
            assertEquals(waitSum, jobWait, 1e-6 * waitSum);
            assertEquals(busySum, jobWork + s[15], 1.0);
        } finally {
            gw.closeBatch(b);
        }
    }

    @Test
    void finishesAtExactTimeAndNextJobStartsThen() {
        // one 1-core VM; two 360 s jobs arriving at 10.37 s: the second starts when the first finishes
        final String cfg = "{\"vm_types\": [{\"name\": \"X\", \"cores\": 1, \"ram_gb\": 4, \"price_per_hour\": 0.1,"
            + " \"min\": 1, \"max\": 1, \"initial\": 1}], \"host_mips\": 4400, \"step_seconds\": 60,"
            + " \"boot_delay_min_s\": 45, \"boot_delay_max_s\": 97, \"cooldown_s\": 0, \"threads\": 1}";
        final Workload w = Workload.of(new double[]{10.37, 10.37}, new double[]{1_584_000, 1_584_000},
            new int[]{1, 1}, new double[]{1, 2});
        final int wid = gw.loadWorkload(w.pack());
        final int b = gw.createBatch(cfg, wid, 1);
        try {
            double[] s = doubles(gw.reset(b, resetRequest(new int[]{0}, new long[]{1})));
            int steps = 0;
            while (s[2] == 0 && steps < 100) {
                s = doubles(gw.step(b, new byte[1]));
                steps++;
                if (s[0] == 360.0) {
                    assertEquals(1, s[10]);
                    assertEquals(1, s[7]);
                    assertEquals(1.0, s[H + 4 + 3], 1e-12, "ram of the running job");
                    assertEquals(1.0, s[H + 4 + 2], 1e-12, "cpu busy over the whole interval");
                }
            }
            final double[] js = doubles(gw.jobStats(b, 0));
            assertEquals(10.37, js[1], 1e-9);
            assertEquals(360.0, js[2] - js[1], 0.1);
            assertEquals(js[2], js[5 + 1], 1e-12, "next queued job starts at the finish time");
            assertEquals(360.0, js[5 + 2] - js[5 + 1], 0.1);
            assertEquals(js[2] - 10.37, js[5 + 3], 1e-9);
            assertEquals(0.0, js[3], 1e-12);
            assertEquals(13, steps); // 10.37 + 720 (+ < 0.1) lies in the 13th step
        } finally {
            gw.closeBatch(b);
            gw.closeWorkload(wid);
        }
    }

    @Test
    void bootDelayTrackedAndBilledFromRequest() {
        final int b = gw.createBatch(config(1, 0, 0, 0, 1, 70, 97), paperId, 1);
        try {
            gw.reset(b, resetRequest(new int[]{0}, new long[]{21}));
            double[] s = doubles(gw.step(b, new byte[]{0, 0, 1})); // request an L at t=0
            assertEquals(1.0, s[H + 9], "booting");
            assertEquals(0.0, s[H + 8]);
            assertEquals((0.2 + 0.8) / 60, s[11], 1e-12);
            final int slot = H + 4 * T + 5; // second VM
            assertEquals(2.0, s[slot]);
            assertEquals(0.0, s[slot + 1]);
            assertEquals(-1.0, s[slot + 4]);
            s = doubles(gw.step(b, new byte[T]));
            // boot took U(70, 97) s: at t=120 it is running for 120 - delay
            assertEquals(1.0, s[H + 8]);
            assertEquals(1.0, s[slot + 1]);
            final double runFor = s[slot + 4];
            assertTrue(runFor > 120 - 97 - 1e-9 && runFor < 120 - 70 + 1e-9, "running_for " + runFor);
            assertEquals(0.0, s[slot + 2], "idle VM: cpu_busy 0");
        } finally {
            gw.closeBatch(b);
        }
    }

    @Test
    void removingInitialVmsAtTimeZeroLeavesNoZombie() {
        // regression: a VM destroyed before the broker got its creation ack was re-created by the broker
        final int b = gw.createBatch(config(1, 1, 1, 0, 1), paperId, 1);
        try {
            gw.reset(b, resetRequest(new int[]{0}, new long[]{1}));
            double[] s = doubles(gw.step(b, new byte[]{0, -1, -1}));
            assertEquals(1, s[H] + s[H + 1] + s[H + 4] + s[H + 5] + s[H + 8] + s[H + 9]);
            s = doubles(gw.step(b, new byte[]{127, 127, 127}));
            assertEquals(30, s[H] + s[H + 1] + s[H + 4] + s[H + 5] + s[H + 8] + s[H + 9]);
        } finally {
            gw.closeBatch(b);
        }
    }

    @Test
    void randomStressKeepsCloudSimInSync() {
        for (double[] boot : new double[][]{{0, 0}, {0, 97}, {45, 97}}) {
            final Config cfg = Config.parse(config(1, 1, 1, 0, 1, boot[0], boot[1]));
            final SimEnv e = new SimEnv(cfg, Workload.paper());
            e.reset(77);
            final SplittableRandom r = new SplittableRandom(4);
            final byte[] act = new byte[T];
            int episodes = 0;
            for (int s = 0; s < 1500; s++) {
                for (int k = 0; k < T; k++) {
                    final double u = r.nextDouble();
                    act[k] = (byte) (u < 0.15 ? -3 : u < 0.3 ? 3 : 0);
                }
                e.step(act, 0);
                assertEquals(e.liveVms(), e.cloudSimVmsOnHosts(), "step " + s);
                final double[] snap = e.snapshot();
                assertTrue(snap[7] >= 0 && snap[10] >= 0 && snap[12] >= 0 && snap[14] >= 0);
                if (e.terminated()) {
                    episodes++;
                    e.reset(77 + episodes);
                }
            }
            assertTrue(episodes >= 1, "boot " + Arrays.toString(boot));
        }
    }

    @Test
    void unknownConfigKeysRejectedWithName() {
        final String good = config(1, 1, 1, 0, 1);
        final IllegalArgumentException e1 = assertThrows(IllegalArgumentException.class,
            () -> gw.createBatch(good.replace("\"threads\"", "\"penalty_per_job_second\": 1e-5, \"threads\""), paperId, 1));
        assertTrue(e1.getMessage().contains("penalty_per_job_second"), e1.getMessage());
        final IllegalArgumentException e2 = assertThrows(IllegalArgumentException.class,
            () -> gw.createBatch(good.replace("\"min\": 1,", "\"min\": 1, \"spot\": true,"), paperId, 1));
        assertTrue(e2.getMessage().contains("spot"), e2.getMessage());
        assertThrows(IllegalArgumentException.class, () -> gw.createBatch(good.replace("\"initial\": 1}", "\"initial\": 11}"), paperId, 1));
        assertThrows(IllegalArgumentException.class, () -> gw.createBatch(good.replace("\"cores\": 8", "\"cores\": 0"), paperId, 1));
        assertThrows(IllegalArgumentException.class, () -> gw.createBatch("{\"vm_types\": []}", paperId, 1));
        assertThrows(IllegalArgumentException.class, () -> gw.createBatch(good, 12345, 1));
    }

    @Test
    void malformedInputsRejected() {
        assertThrows(IllegalArgumentException.class, () -> gw.loadWorkload(new byte[3]));
        final byte[] ok = Workload.of(new double[]{1, 5}, new double[]{1, 1}, new int[]{1, 1}, new double[]{0, 0}).pack();
        assertThrows(IllegalArgumentException.class, () -> gw.loadWorkload(Arrays.copyOf(ok, ok.length - 1)));
        final IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
            () -> Workload.of(new double[]{5, 1}, new double[]{1, 1}, new int[]{1, 1}, new double[]{0, 0}));
        assertTrue(e.getMessage().contains("sorted"), e.getMessage());
        final int big = gw.loadWorkload(Workload.of(new double[]{0}, new double[]{1}, new int[]{16}, new double[]{0}).pack());
        assertThrows(IllegalArgumentException.class, () -> gw.createBatch(config(1, 1, 1, 0, 1), big, 1));
        gw.closeWorkload(big);
    }

    @Test
    void benchLoopCountsSteps() {
        final int steps = 300, nEnvs = 4;
        final byte[] res = java.util.Base64.getDecoder().decode(gw.benchJavaLoop(config(1, 1, 1, 0, 2), paperId, nEnvs, steps, new byte[steps * nEnvs * T], 1));
        final ByteBuffer bb = ByteBuffer.wrap(res).order(ByteOrder.LITTLE_ENDIAN);
        final double elapsed = bb.getDouble(), envSteps = bb.getDouble();
        assertTrue(elapsed > 0);
        assertEquals(steps * nEnvs, envSteps);
        assertThrows(IllegalArgumentException.class,
            () -> gw.benchJavaLoop(config(1, 1, 1, 0, 2), paperId, nEnvs, steps, new byte[5], 1));
    }

    @Test
    void badIdsAndSizesRejected() {
        assertThrows(IllegalArgumentException.class, () -> gw.step(999, new byte[3]));
        final int b = gw.createBatch(config(1, 1, 1, 0, 1), paperId, 2);
        try {
            assertThrows(IllegalStateException.class, () -> gw.step(b, new byte[6]));
            gw.reset(b, resetRequest(new int[]{0, 1}, new long[]{1, 2}));
            assertThrows(IllegalArgumentException.class, () -> gw.step(b, new byte[5]));
            assertThrows(IllegalArgumentException.class, () -> gw.reset(b, resetRequest(new int[]{2}, new long[]{1})));
            assertThrows(IllegalArgumentException.class, () -> gw.reset(b, new byte[7]));
            final double[] s = doubles(gw.reset(b, resetRequest(new int[]{1, 0}, new long[]{1, 2})));
            assertEquals(2 * R, s.length);
        } finally {
            gw.closeBatch(b);
        }
        assertThrows(IllegalArgumentException.class, () -> gw.closeBatch(b));
    }

    @Test
    void acceptedSocketsHaveTcpNoDelay() throws Exception {
        try (ServerSocket ss = new Main.NoDelayServerSocketFactory().createServerSocket()) {
            ss.bind(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0));
            try (Socket client = new Socket(InetAddress.getLoopbackAddress(), ss.getLocalPort());
                 Socket accepted = ss.accept()) {
                assertTrue(accepted.getTcpNoDelay());
                assertNotEquals(0, client.getLocalPort());
            }
        }
    }

    @Test
    void envWorkloadCanBeReplacedBetweenEpisodes() {
        final int b = gw.createBatch(config(1, 0, 0, 0, 1), paperId, 2);
        try {
            // one 4-core job behind nothing: it cannot start on the lone 2-core S VM
            final Workload small = Workload.of(new double[]{0.0, 30.0}, new double[]{4400.0 * 60, 4400.0 * 60},
                new int[]{4, 1}, new double[]{1.0, 0.5});
            gw.setEnvWorkload(b, 1, small.pack());
            gw.reset(b, resetRequest(new int[]{0, 1}, new long[]{1, 2}));
            double[] s = doubles(gw.step(b, new byte[2 * T]));
            final double[] env1 = java.util.Arrays.copyOfRange(s, R, 2 * R);
            assertEquals(2, env1[5], "env 1 replays the small workload");
            assertEquals(5, env1[16], "queued cores: the 4-core head and the 1-core job behind it");
            assertEquals(4, env1[18], "head-of-line job cores");
            assertEquals(2, env1[19], "largest free slot: the idle S VM");
            assertEquals(0, s[5], "env 0 still replays the paper's workload (first batch at 1800 s)");
            assertThrows(IllegalArgumentException.class, () -> gw.setEnvWorkload(b, 2, small.pack()));
        } finally {
            gw.closeBatch(b);
        }
    }
    // ------------------------------------------------------------------ audit: degenerate configs, framing
    static String vmType(long cores, long max) {
        return "{\"cores\": " + cores + ", \"ram_gb\": 8, \"price_per_hour\": 0.2, \"min\": 0, \"max\": " + max
            + ", \"initial\": 0}";
    }

    static String oneType(long cores, long max) {
        return "{\"vm_types\": [" + vmType(cores, max) + "]}";
    }

    @Test
    void aFleetTooLargeToSimulateIsRejectedNamingVmTypes() {
        // 2 x 1.2e9 slots overflowed the int record size (message "-884901859"); 2e9 ran out of heap
        final String twoHuge = "{\"vm_types\": [" + vmType(2, 1_200_000_000L) + ", " + vmType(2, 1_200_000_000L) + "]}";
        for (String cfg : new String[]{twoHuge, oneType(2, 2_000_000_000L), oneType(2_000_000_000L, 1)}) {
            final IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> gw.createBatch(cfg, paperId, 1), cfg);
            assertTrue(e.getMessage().startsWith("vm_types: "), e.getMessage());
        }
        final int b = gw.createBatch(oneType(8, 20), paperId, 1); // an ordinary fleet still passes
        gw.closeBatch(b);
    }

    @Test
    void hostMipsBelowOneIsRejectedAtCreateNotAtReset() {
        // CloudSim Plus could place no VM on such PEs: reset failed with "initial VMs still waiting..."
        final String cfg = config(1, 1, 1, 0, 1).replace("\"host_mips\": 4400", "\"host_mips\": 0.5");
        final IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
            () -> gw.createBatch(cfg, paperId, 1));
        assertTrue(e.getMessage().contains("host_mips"), e.getMessage());
    }

    @Test
    void aStepChannelFrameWithABadLengthIsAnsweredBeforeTheConnectionCloses() throws Exception {
        final String[] portToken = gw.openStepChannel().split(":");
        try (Socket s = new Socket(InetAddress.getLoopbackAddress(), Integer.parseInt(portToken[0]))) {
            s.setSoTimeout(30_000);
            s.getOutputStream().write(portToken[1].getBytes(java.nio.charset.StandardCharsets.US_ASCII));
            s.getOutputStream().write(ByteBuffer.allocate(12).putInt(StepChannel.OP_STEP).putInt(1).putInt(-5).array());
            final java.io.DataInputStream in = new java.io.DataInputStream(s.getInputStream());
            assertEquals(1, in.readInt(), "status");
            final byte[] msg = new byte[in.readInt()];
            in.readFully(msg);
            assertTrue(new String(msg, java.nio.charset.StandardCharsets.UTF_8).contains("frame length -5"));
            assertEquals(-1, in.read(), "then the connection closes");
        }
    }
    @Test
    void snapshotsTooLargeForOneReplyAreRejectedNamingTheCount() {
        // nEnvs=2e9 was "Java heap space"; 1.5M resets of one env overflowed the reply size to a negative number
        final IllegalArgumentException many = assertThrows(IllegalArgumentException.class,
            () -> gw.createBatch(config(1, 1, 1, 0, 1), paperId, 2_000_000_000));
        assertTrue(many.getMessage().startsWith("nEnvs=2000000000 is too many"), many.getMessage());
        final int b = gw.createBatch(config(1, 1, 1, 0, 1), paperId, 1);
        try {
            final int k = 1_500_000;
            final IllegalArgumentException big = assertThrows(IllegalArgumentException.class,
                () -> gw.reset(b, resetRequest(new int[k], new long[k])));
            assertTrue(big.getMessage().startsWith("reset request: k=1500000 snapshots"), big.getMessage());
            assertEquals(R, doubles(gw.reset(b, resetRequest(new int[]{0}, new long[]{1}))).length);
        } finally {
            gw.closeBatch(b);
        }
    }
}
