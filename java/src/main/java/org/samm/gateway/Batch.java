package org.samm.gateway;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.DoubleBuffer;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A batch of independent simulations of one workload and one config, stepped together
 * (in parallel on {@code threads} worker threads; results do not depend on the thread count).
 */
final class Batch implements AutoCloseable {
    private static final AtomicInteger POOL_IDS = new AtomicInteger();
    /**
     * Most bytes of snapshots in one reply (the largest Java array): past it the int sizes of arrays and
     * of the step channel's frames overflow, and the error was a bare negative number.
     */
    static final long MAX_REPLY_BYTES = Integer.MAX_VALUE - 8;

    final Config cfg;
    final Workload wl;
    final SimEnv[] envs;
    private final int nThreads;
    private final ExecutorService pool;

    Batch(Config cfg, Workload wl, int nEnvs) {
        if (nEnvs < 1) {
            throw new IllegalArgumentException("nEnvs must be >= 1, got " + nEnvs);
        }
        if ((long) nEnvs * cfg.recordDoubles * 8 > MAX_REPLY_BYTES) {
            throw new IllegalArgumentException("nEnvs=" + nEnvs + " is too many: their snapshots ("
                + cfg.recordDoubles * 8 + " bytes each) must fit one reply of at most " + MAX_REPLY_BYTES + " bytes");
        }
        cfg.checkWorkload(wl);
        this.cfg = cfg;
        this.wl = wl;
        this.envs = new SimEnv[nEnvs];
        for (int i = 0; i < nEnvs; i++) {
            envs[i] = new SimEnv(cfg, wl);
        }
        final int requested = cfg.threads == 0 ? Runtime.getRuntime().availableProcessors() : cfg.threads;
        this.nThreads = Math.max(1, Math.min(requested, nEnvs));
        if (nThreads > 1) {
            final int poolId = POOL_IDS.incrementAndGet();
            final AtomicInteger tid = new AtomicInteger();
            this.pool = Executors.newFixedThreadPool(nThreads - 1, r -> {
                final Thread th = new Thread(r, "samm-batch-" + poolId + "-" + tid.incrementAndGet());
                th.setDaemon(true);
                return th;
            });
        } else {
            this.pool = null;
        }
    }

    int nEnvs() {
        return envs.length;
    }

    int recordBytes() {
        return cfg.recordDoubles * 8;
    }

    /** Reset request: int32 k, then k x (int32 env, int64 seed). Returns k snapshots in request order. */
    synchronized byte[] reset(byte[] request) {
        if (request == null || request.length < 4) {
            throw new IllegalArgumentException("reset request too short: need int32 k");
        }
        final ByteBuffer b = ByteBuffer.wrap(request).order(ByteOrder.LITTLE_ENDIAN);
        final int k = b.getInt();
        if (k < 0 || request.length != 4L + 12L * k) {
            throw new IllegalArgumentException("reset request: expected " + (4L + 12L * Math.max(k, 0))
                + " bytes for k=" + k + ", got " + request.length);
        }
        if ((long) k * recordBytes() > MAX_REPLY_BYTES) {
            throw new IllegalArgumentException("reset request: k=" + k + " snapshots of " + recordBytes()
                + " bytes do not fit one reply of at most " + MAX_REPLY_BYTES + " bytes");
        }
        final int[] idx = new int[k];
        final long[] seeds = new long[k];
        for (int i = 0; i < k; i++) {
            idx[i] = b.getInt();
            seeds[i] = b.getLong();
            if (idx[i] < 0 || idx[i] >= envs.length) {
                throw new IllegalArgumentException("reset request: env index " + idx[i] + " out of range [0, "
                    + envs.length + ")");
            }
        }
        final byte[] out = new byte[k * recordBytes()];
        final DoubleBuffer db = ByteBuffer.wrap(out).order(ByteOrder.LITTLE_ENDIAN).asDoubleBuffer();
        for (int i = 0; i < k; i++) {
            final SimEnv e = envs[idx[i]];
            e.reset(seeds[i]);
            db.put(e.snapshot());
        }
        return out;
    }

    /**
     * Gives env {@code env} another workload (training on a distribution of workloads): the env is
     * rebuilt around it and must be reset before its next step.
     */
    synchronized void setWorkload(int env, Workload w) {
        if (env < 0 || env >= envs.length) {
            throw new IllegalArgumentException("env index " + env + " out of range [0, " + envs.length + ")");
        }
        cfg.checkWorkload(w);
        envs[env] = new SimEnv(cfg, w);
    }

    /** Resets one env (used by the Java bench loop). */
    synchronized void resetOne(int env, long seed) {
        envs[env].reset(seed);
    }

    /** Steps every env once; actions are int8[nEnvs][nTypes]. Returns all snapshots, env order. */
    synchronized byte[] step(byte[] actions) {
        final byte[] out = new byte[envs.length * recordBytes()];
        stepInto(actions, ByteBuffer.wrap(out).order(ByteOrder.LITTLE_ENDIAN).asDoubleBuffer());
        return out;
    }

    /** Steps every env once and writes all snapshots, env order, into {@code out} (the step channel's reply). */
    synchronized void stepInto(byte[] actions, DoubleBuffer out) {
        stepInPlace(actions);
        for (SimEnv e : envs) {
            out.put(e.snapshot());
        }
    }

    /** Steps every env once without packing the snapshots (they stay in each env). */
    synchronized void stepInPlace(byte[] actions) {
        final int nt = cfg.nTypes;
        if (actions == null || actions.length != envs.length * nt) {
            throw new IllegalArgumentException("actions: expected " + (envs.length * nt) + " bytes (nEnvs="
                + envs.length + " x nTypes=" + nt + "), got " + (actions == null ? "null" : actions.length));
        }
        for (int i = 0; i < envs.length; i++) {
            if (!envs[i].isReset()) {
                throw new IllegalStateException("env " + i + " of the batch was never reset"
                    + " (or its last reset or step failed): reset it first");
            }
        }
        if (pool == null) {
            for (int i = 0; i < envs.length; i++) {
                envs[i].step(actions, i * nt);
            }
            return;
        }
        final int chunks = nThreads;
        final List<Future<?>> futures = new ArrayList<>(chunks - 1);
        for (int c = 1; c < chunks; c++) {
            final int from = c * envs.length / chunks;
            final int to = (c + 1) * envs.length / chunks;
            futures.add(pool.submit(() -> {
                for (int i = from; i < to; i++) {
                    envs[i].step(actions, i * nt);
                }
            }));
        }
        RuntimeException first = null;
        try {
            final int to = envs.length / chunks;
            for (int i = 0; i < to; i++) {
                envs[i].step(actions, i * nt);
            }
        } catch (RuntimeException e) {
            first = e;
        }
        for (Future<?> f : futures) {
            try {
                f.get();
            } catch (ExecutionException e) {
                if (first == null) {
                    final Throwable cause = e.getCause();
                    first = cause instanceof RuntimeException re ? re : new IllegalStateException(cause);
                }
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                if (first == null) first = new IllegalStateException("interrupted while stepping", e);
            }
        }
        if (first != null) {
            throw first;
        }
    }

    synchronized byte[] jobStats(int env) {
        if (env < 0 || env >= envs.length) {
            throw new IllegalArgumentException("env index " + env + " out of range [0, " + envs.length + ")");
        }
        if (!envs[env].isReset()) {
            throw new IllegalStateException("env " + env + " was never reset"
                + " (or its last reset or step failed): reset it first");
        }
        final double[] s = envs[env].jobStats();
        final byte[] out = new byte[s.length * 8];
        ByteBuffer.wrap(out).order(ByteOrder.LITTLE_ENDIAN).asDoubleBuffer().put(s);
        return out;
    }

    @Override
    public void close() {
        if (pool != null) {
            pool.shutdownNow();
        }
    }
}
