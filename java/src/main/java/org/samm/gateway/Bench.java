package org.samm.gateway;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.SplittableRandom;

/**
 * Java-only throughput of the bench loop ({@link Gateway#benchJavaLoop}) on the paper workload with the default
 * config. Usage: {@code java -cp samm-gateway.jar org.samm.gateway.Bench [nEnvs=8] [steps=20000] [mode=random|zero]
 * [threads=0] [repeats=3]}. Random actions: each type gets -1/+1 with probability 0.05 each (seeded).
 */
public final class Bench {
    private Bench() {
    }

    public static String defaultConfig(int threads) {
        return "{\"vm_types\": ["
            + "{\"name\": \"S\", \"cores\": 2, \"ram_gb\": 8, \"price_per_hour\": 0.2, \"min\": 1, \"max\": 10, \"initial\": 1},"
            + "{\"name\": \"M\", \"cores\": 4, \"ram_gb\": 16, \"price_per_hour\": 0.4, \"min\": 0, \"max\": 10, \"initial\": 1},"
            + "{\"name\": \"L\", \"cores\": 8, \"ram_gb\": 32, \"price_per_hour\": 0.8, \"min\": 0, \"max\": 10, \"initial\": 1}],"
            + "\"host_mips\": 4400, \"step_seconds\": 60, \"boot_delay_min_s\": 45, \"boot_delay_max_s\": 97,"
            + "\"cooldown_s\": 0, \"threads\": " + threads + "}";
    }

    public static void main(String[] args) {
        final int nEnvs = args.length > 0 ? Integer.parseInt(args[0]) : 8;
        final int steps = args.length > 1 ? Integer.parseInt(args[1]) : 20000;
        final String mode = args.length > 2 ? args[2] : "random";
        final int threads = args.length > 3 ? Integer.parseInt(args[3]) : 0;
        final int repeats = args.length > 4 ? Integer.parseInt(args[4]) : 3;
        Logging.configure(true);
        final Gateway g = new Gateway();
        final int wid = g.loadWorkload(Workload.paper().pack());
        final String cfg = defaultConfig(threads);
        final byte[] actions = new byte[steps * nEnvs * 3];
        if (mode.equals("random")) {
            final SplittableRandom r = new SplittableRandom(12345);
            for (int i = 0; i < actions.length; i++) {
                final double u = r.nextDouble();
                actions[i] = (byte) (u < 0.05 ? -1 : u < 0.10 ? 1 : 0);
            }
        }
        // warm-up
        g.benchJavaLoop(cfg, wid, nEnvs, Math.min(steps, 3000), java.util.Arrays.copyOf(actions, Math.min(steps, 3000) * nEnvs * 3), 7);
        for (int k = 0; k < repeats; k++) {
            final byte[] res = java.util.Base64.getDecoder().decode(g.benchJavaLoop(cfg, wid, nEnvs, steps, actions, 1000L * k));
            final ByteBuffer b = ByteBuffer.wrap(res).order(ByteOrder.LITTLE_ENDIAN);
            final double el = b.getDouble(), n = b.getDouble();
            System.out.printf("nEnvs=%d threads=%d mode=%s: %.0f env-steps in %.3f s = %.0f env-steps/s%n",
                nEnvs, threads, mode, n, el, n / el);
        }
    }
}
