package org.samm.gateway;

public class QuickRun {
    public static void main(String[] a) {
        Logging.configure(false);
        Config cfg = Config.parse(TestSupport.config(Integer.parseInt(a[0]), Integer.parseInt(a[1]), Integer.parseInt(a[2]), 0, 1));
        SimEnv e = new SimEnv(cfg, Workload.paper());
        e.reset(1);
        byte[] act = new byte[3];
        double cost = 0, wait = 0; int steps = 0;
        long t0 = System.nanoTime();
        while (!e.terminated() && steps < 100000) {
            e.step(act, 0); steps++;
            double[] s = e.snapshot();
            cost += s[11]; wait += s[12];
            if (steps <= 3 || steps % 50 == 0 || e.terminated()) System.out.printf("step %d clock %.1f sub %d waiting %d fin %d run %d cost %.5f wait %.1f busy %.1f%n", steps, s[0], (int)s[5], (int)s[7], (int)s[9], (int)s[10], s[11], s[12], s[14]);
        }
        System.out.printf("steps %d cost %.6f wait %.3f  %.1f ms cs-clock %.4f%n", steps, cost, wait, (System.nanoTime()-t0)/1e6, e.cloudSimClock());
        double[] js = e.jobStats(); double maxErr = 0;
        for (int j = 0; j < e.n; j++) { double d = js[j*5+2]-js[j*5+1] - e.wl.lengthMi[j]/4400.0; maxErr = Math.max(maxErr, Math.abs(d)); }
        System.out.println("max finish err " + maxErr);
    }
}
