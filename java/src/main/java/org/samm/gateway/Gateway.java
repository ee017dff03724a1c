package org.samm.gateway;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Base64;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * Py4J entry point (see docs/bridge-protocol.md). Every array travels as packed little-endian bytes; replies
 * are Base64 strings of those bytes, because py4j 0.10.9.9 decodes a byte[] reply with a per-byte Python loop
 * (3.4 ms for an 11 KB step reply) while a string crosses at C speed.
 * Methods are safe to call from several Py4J connection threads; one batch is stepped by one call at a time.
 */
public final class Gateway {
    public static final String VERSION = "0.1.0";
    public static final String CLOUDSIMPLUS_VERSION = "8.5.7";

    private final Map<Integer, Workload> workloads = new ConcurrentHashMap<>();
    private final Map<Integer, Batch> batches = new ConcurrentHashMap<>();
    private final AtomicInteger nextWorkloadId = new AtomicInteger(1);
    private final AtomicInteger nextBatchId = new AtomicInteger(1);

    private volatile StepChannel channel;
    private volatile String channelAddress = "127.0.0.1";

    public Gateway() {
        Logging.ensureConfigured();
    }

    /** The loopback address the step channel binds (Main passes its --address). */
    void setChannelAddress(String address) {
        this.channelAddress = address;
    }

    /**
     * Starts (once) the raw-socket step channel on a free loopback port and returns
     * {@code "<port>:<token>"}; see {@link StepChannel}.
     */
    public synchronized String openStepChannel() throws java.io.IOException {
        if (channel == null) {
            channel = new StepChannel(channelAddress, this::batch);
        }
        return channel.port() + ":" + channel.token();
    }

    public String ping() {
        return "samm-gateway " + VERSION + " cloudsimplus " + CLOUDSIMPLUS_VERSION;
    }

    public int loadWorkload(byte[] packed) {
        final Workload w = Workload.unpack(packed);
        final int id = nextWorkloadId.getAndIncrement();
        workloads.put(id, w);
        return id;
    }

    public int createBatch(String configJson, int workloadId, int nEnvs) {
        final Config cfg = Config.parse(configJson);
        final Batch b = new Batch(cfg, workload(workloadId), nEnvs);
        final int id = nextBatchId.getAndIncrement();
        batches.put(id, b);
        return id;
    }

    /** Packs a workload (as {@link #loadWorkload}) straight into one env of a batch; reset it next. */
    public void setEnvWorkload(int batchId, int env, byte[] packed) {
        batch(batchId).setWorkload(env, Workload.unpack(packed));
    }

    public String reset(int batchId, byte[] request) {
        return b64(batch(batchId).reset(request));
    }

    public String step(int batchId, byte[] actions) {
        return b64(batch(batchId).step(actions));
    }

    public String jobStats(int batchId, int env) {
        return b64(batch(batchId).jobStats(env));
    }

    private static String b64(byte[] bytes) {
        return Base64.getEncoder().encodeToString(bytes);
    }

    /**
     * The Python bench loop in Java only: env i is reset with seed+i; after each step, every env whose
     * snapshot says terminated is reset with seed i + nEnvs*k (k = how many times that env has ended,
     * from 1). Times the stepping loop including those resets. Returns float64[2] = {elapsed_s, env_steps}.
     */
    public String benchJavaLoop(String configJson, int workloadId, int nEnvs, int steps, byte[] actions, long seed) {
        final Config cfg = Config.parse(configJson);
        if (steps < 0) {
            throw new IllegalArgumentException("steps must be >= 0, got " + steps);
        }
        final int row = nEnvs * cfg.nTypes;
        if (actions == null || actions.length != (long) steps * row) {
            throw new IllegalArgumentException("actions: expected steps x nEnvs x nTypes = " + ((long) steps * row)
                + " bytes, got " + (actions == null ? "null" : actions.length));
        }
        try (Batch b = new Batch(cfg, workload(workloadId), nEnvs)) {
            for (int i = 0; i < nEnvs; i++) {
                b.resetOne(i, seed + i);
            }
            final int[] ended = new int[nEnvs];
            final byte[] stepActions = new byte[row];
            final long t0 = System.nanoTime();
            for (int s = 0; s < steps; s++) {
                System.arraycopy(actions, s * row, stepActions, 0, row);
                b.stepInPlace(stepActions);
                for (int i = 0; i < nEnvs; i++) {
                    if (b.envs[i].terminated()) {
                        ended[i]++;
                        b.resetOne(i, seed + i + (long) nEnvs * ended[i]);
                    }
                }
            }
            final double elapsed = (System.nanoTime() - t0) / 1e9;
            final byte[] out = new byte[16];
            ByteBuffer.wrap(out).order(ByteOrder.LITTLE_ENDIAN).putDouble(elapsed).putDouble((double) steps * nEnvs);
            return b64(out);
        }
    }

    public void closeBatch(int id) {
        final Batch b = batches.remove(id);
        if (b == null) {
            throw new IllegalArgumentException("unknown batch id " + id);
        }
        b.close();
    }

    public void closeWorkload(int id) {
        if (workloads.remove(id) == null) {
            throw new IllegalArgumentException("unknown workload id " + id);
        }
    }

    private Workload workload(int id) {
        final Workload w = workloads.get(id);
        if (w == null) {
            throw new IllegalArgumentException("unknown workload id " + id);
        }
        return w;
    }

    private Batch batch(int id) {
        final Batch b = batches.get(id);
        if (b == null) {
            throw new IllegalArgumentException("unknown batch id " + id);
        }
        return b;
    }
}
