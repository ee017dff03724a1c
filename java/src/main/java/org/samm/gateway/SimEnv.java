package org.samm.gateway;

import org.cloudsimplus.allocationpolicies.VmAllocationPolicySimple;
import org.cloudsimplus.brokers.DatacenterBrokerSimple;
import org.cloudsimplus.cloudlets.Cloudlet;
import org.cloudsimplus.cloudlets.CloudletExecution;
import org.cloudsimplus.cloudlets.CloudletSimple;
import org.cloudsimplus.core.CloudSimEntity;
import org.cloudsimplus.core.CloudSimPlus;
import org.cloudsimplus.core.events.SimEvent;
import org.cloudsimplus.datacenters.DatacenterSimple;
import org.cloudsimplus.hosts.Host;
import org.cloudsimplus.hosts.HostSimple;
import org.cloudsimplus.listeners.CloudletVmEventInfo;
import org.cloudsimplus.listeners.EventListener;
import org.cloudsimplus.resources.Pe;
import org.cloudsimplus.resources.PeSimple;
import org.cloudsimplus.schedulers.MipsShare;
import org.cloudsimplus.schedulers.cloudlet.CloudletSchedulerSpaceShared;
import org.cloudsimplus.utilizationmodels.UtilizationModel;
import org.cloudsimplus.utilizationmodels.UtilizationModelFull;
import org.cloudsimplus.vms.Vm;
import org.cloudsimplus.vms.VmSimple;

import java.util.ArrayList;
import java.util.List;
import java.util.SplittableRandom;

/**
 * One autoscaling simulation on top of CloudSim Plus 8.5.7.
 *
 * <p>CloudSim Plus executes the jobs (one {@link CloudletSimple} per job, space-shared, on {@link VmSimple}s
 * placed on {@link HostSimple}s of a {@link DatacenterSimple}, submitted through a {@link DatacenterBrokerSimple}).
 * This class owns the FIFO queue, dispatch (best fit), VM boot tracking, victim choice, cool-down, billing and
 * the exact integrals, all computed from event times.</p>
 *
 * <p>Driving CloudSim Plus: {@code runFor} only moves the next batch of same-time future events into the
 * entities' queues (and jumps the clock); the entities handle them at the start of the next {@code runFor}
 * call. So after advancing, we "settle" with {@code runFor(0)} until a call moves no event: then every event
 * up to the current clock has been handled and state can be read. Our own wake-up events (a tiny entity)
 * stop the clock at arrival times, boot completions and the step end; a keep-alive event far in the
 * future keeps the simulation from finishing.</p>
 *
 * <p>Not thread-safe; one env is only ever stepped by one thread at a time.</p>
 */
final class SimEnv {
    static final byte NOT_ARRIVED = 0, QUEUED = 1, RUNNING = 2, FINISHED = 3;

    /** Tolerance for comparing our exact target times with the CloudSim clock (event time = clock + delay). */
    static final double EPS = 1e-7;
    /** Keep-alive event time (never reached). */
    static final double FAR_FUTURE = 1e15;
    /**
     * CloudSim time = workload time + EPOCH. At reset the simulation runs up to EPOCH so that the broker has
     * received the datacenter's creation acks of the initial VMs (sent minTimeBetweenEvents after creation):
     * a VM destroyed before its ack arrives is re-requested by the broker (retry of "failed" VMs) and would
     * come back as a zombie holding a host.
     */
    static final double EPOCH = 1.0;
    /**
     * CloudSim Plus minimal time between events. The default 0.1 s makes the datacenter skip cloudlet updates
     * closer than that (and delays a cloudlet's finish by up to 0.11 s after a fractional-MI truncation);
     * 0.001 s bounds the finish-time error by ~0.011 s.
     */
    static final double MIN_TIME_BETWEEN_EVENTS = 0.001;
    /** Safety cap on runFor calls in one step or one settle. */
    static final int MAX_RUNFOR_CALLS = 10_000_000;
    static final int TAG_WAKE = 987_001;

    // ------------------------------------------------------------------ static setup
    final Config cfg;
    final Workload wl;
    final int n;
    final int nTypes;
    final double[] snap;

    // ------------------------------------------------------------------ per-job state (reused across resets)
    final byte[] jState;
    final double[] jStart;
    final double[] jFinish;
    final double[] jWait;
    final double[] jEnq;
    final int[] jRestarts;
    final VmRec[] jVm;
    final JobCloudlet[] jCl;

    // ------------------------------------------------------------------ per-episode state
    private boolean isReset;
    private CountingSim sim;
    private DatacenterSimple dc;
    private DatacenterBrokerSimple broker;
    private Waker waker;
    private UtilizationModelFull cpuModel;
    private final EventListener<CloudletVmEventInfo> finishListener = this::onCloudletFinish;
    private SplittableRandom rng;

    private double t;                 // workload time (end of the last step)
    private int stepIndex;
    private int nextArrival;
    private int finished;
    private int running;
    private int runCores;
    private int queuedCores;
    private long requeuedTotal;
    private double lostCoreSec;
    private double lastAppliedActionTime;
    private int vmSeq;
    private long cloudletSeq;
    private final IntMinHeap queue = new IntMinHeap();
    private final ArrayList<VmRec> live = new ArrayList<>();
    private final int[] typeRunning;
    private final int[] typeBooting;
    private final IntList finishedBuf = new IntList(256);
    private final ArrayList<Cloudlet> pendingCloudlets = new ArrayList<>();
    private final ArrayList<Vm> pendingVms = new ArrayList<>();

    // per-step (interval) accumulators
    private double t0, t1;
    private double lastIntegT;
    private double waitInt;
    private double busyInt;
    private int submittedInterval;
    private int intervalFirstJob;
    private boolean actionApplied;

    /** Our record of a VM. */
    static final class VmRec {
        int seq;
        int type;
        int cores;
        double requestT;
        double bootDoneT;
        boolean running;
        double runSince;
        VmSimple vm;
        int used;
        double ramUsed;
        double busyInt;
        double lastT;
        final IntList jobs = new IntList(8);
    }

    /** A cloudlet that knows its job. */
    static final class JobCloudlet extends CloudletSimple {
        final int job;

        JobCloudlet(int job, long lengthPerPe, int pes, UtilizationModel cpu) {
            super(lengthPerPe, pes, cpu);
            this.job = job;
        }

        /**
         * We never register update-processing listeners; skipping the (empty) HashSet iteration that CloudSim
         * Plus does for every cloudlet on every datacenter update is a pure speed-up.
         */
        @Override
        public void notifyOnUpdateProcessingListeners(double time) {
            // no listeners
        }
    }

    /**
     * {@link CloudletSchedulerSpaceShared} with the same semantics, but {@link #getAvailableMipsByPe()} sums the
     * running cloudlets' PEs with a plain loop instead of a stream (it is called for every cloudlet on every
     * update, which made the stream the top hotspot).
     */
    static final class SpaceShared extends CloudletSchedulerSpaceShared {
        private List<CloudletExecution> execView; // a live read-only view of the exec list

        @Override
        public double getAvailableMipsByPe() {
            final MipsShare share = getCurrentMipsShare();
            long total = 0;
            List<CloudletExecution> exec = execView;
            if (exec == null) {
                exec = execView = getCloudletExecList();
            }
            for (int i = 0, s = exec.size(); i < s; i++) {
                total += exec.get(i).getCloudlet().getPesNumber();
            }
            if (total > share.pes()) {
                return share.totalMips() / total;
            }
            return share.mips();
        }
    }

    /** CloudSimPlus that counts the future events it processes (moves to the entities). */
    static final class CountingSim extends CloudSimPlus {
        long moved;
        private double strClock = Double.NaN;
        private String str = "";

        CountingSim(double minTimeBetweenEvents) {
            super(minTimeBetweenEvents);
        }

        /**
         * CloudSim Plus formats the clock with String.format("%.2f") for every log call, even for discarded
         * messages (e.g. a trace for every duplicate datacenter update); that was ~10 % of the run time.
         * Same text, formatted by hand and cached per clock value.
         */
        @Override
        public String clockStr() {
            final double c = clock();
            if (c != strClock) {
                strClock = c;
                str = format2(c);
            }
            return str;
        }

        static String format2(double v) {
            if (Double.isNaN(v) || Double.isInfinite(v) || Math.abs(v) >= 1e15) {
                return String.format("%.2f", v);
            }
            final long cents = Math.round(Math.abs(v) * 100.0);
            final StringBuilder sb = new StringBuilder(24);
            if (v < 0 && cents != 0) sb.append('-');
            sb.append(cents / 100).append('.');
            final long frac = cents % 100;
            if (frac < 10) sb.append('0');
            sb.append(frac);
            return sb.toString();
        }

        @Override
        protected void processEvent(SimEvent evt) {
            super.processEvent(evt);
            moved++;
        }
    }

    /** A do-nothing entity whose self-scheduled events stop the clock at exact times. */
    static final class Waker extends CloudSimEntity {
        Waker(CloudSimPlus sim) {
            super(sim);
            setName("SammWaker");
        }

        @Override
        protected void startInternal() {
            // nothing
        }

        @Override
        public void processEvent(SimEvent evt) {
            // the event itself is the point: it makes runFor stop at its time
        }

        /** Wakes at the given workload time. */
        void wakeAt(double time) {
            final double delay = (time + EPOCH) - getSimulation().clock();
            schedule(this, Math.max(0.0, delay), TAG_WAKE);
        }
    }

    SimEnv(Config cfg, Workload wl) {
        this.cfg = cfg;
        this.wl = wl;
        this.n = wl.n;
        this.nTypes = cfg.nTypes;
        this.snap = new double[cfg.recordDoubles];
        this.jState = new byte[n];
        this.jStart = new double[n];
        this.jFinish = new double[n];
        this.jWait = new double[n];
        this.jEnq = new double[n];
        this.jRestarts = new int[n];
        this.jVm = new VmRec[n];
        this.jCl = new JobCloudlet[n];
        this.typeRunning = new int[nTypes];
        this.typeBooting = new int[nTypes];
    }

    boolean isReset() {
        return isReset;
    }

    boolean terminated() {
        return finished == n;
    }

    double[] snapshot() {
        return snap;
    }

    // ================================================================== reset
    void reset(long seed) {
        // a reset that fails half-way (an OutOfMemoryError building a large fleet) has already dropped the
        // last episode's state: stepping on would report a fleet and jobs that no longer exist
        isReset = false;
        rng = new SplittableRandom(seed);
        java.util.Arrays.fill(jState, NOT_ARRIVED);
        java.util.Arrays.fill(jStart, -1.0);
        java.util.Arrays.fill(jFinish, -1.0);
        java.util.Arrays.fill(jWait, 0.0);
        java.util.Arrays.fill(jEnq, 0.0);
        java.util.Arrays.fill(jRestarts, 0);
        java.util.Arrays.fill(jVm, null);
        java.util.Arrays.fill(jCl, null);
        t = 0;
        stepIndex = 0;
        nextArrival = 0;
        finished = 0;
        running = 0;
        runCores = 0;
        queuedCores = 0;
        requeuedTotal = 0;
        lostCoreSec = 0;
        lastAppliedActionTime = Double.NEGATIVE_INFINITY;
        vmSeq = 0;
        cloudletSeq = 0;
        queue.clear();
        live.clear();
        java.util.Arrays.fill(typeRunning, 0);
        java.util.Arrays.fill(typeBooting, 0);
        finishedBuf.clear();
        pendingCloudlets.clear();
        pendingVms.clear();

        // ---- a fresh CloudSim Plus world
        sim = new CountingSim(MIN_TIME_BETWEEN_EVENTS);
        final long hostRamMb = ramMb(cfg.maxRamGb);
        final List<Host> hosts = new ArrayList<>(Math.max(1, cfg.nSlots));
        // one host per VM slot, each as large as the largest type: any VM always finds an empty host
        for (int h = 0; h < Math.max(1, cfg.nSlots); h++) {
            final List<Pe> pes = new ArrayList<>(cfg.maxCores);
            for (int p = 0; p < cfg.maxCores; p++) {
                pes.add(new PeSimple(cfg.hostMips));
            }
            hosts.add(new HostSimple(hostRamMb, 100_000L, 10_000_000L, pes));
        }
        final VmAllocationPolicySimple policy = new VmAllocationPolicySimple();
        policy.setHostCountForParallelSearch(Integer.MAX_VALUE); // never use the common ForkJoin pool
        dc = new DatacenterSimple(sim, hosts, policy);
        broker = new DatacenterBrokerSimple(sim, "SammBroker");
        broker.setShutdownWhenIdle(false);
        waker = new Waker(sim);
        cpuModel = new UtilizationModelFull();

        // ---- initial fleet, already running (no boot delay)
        for (int ty = 0; ty < nTypes; ty++) {
            final Config.VmType type = cfg.vmTypes.get(ty);
            for (int k = 0; k < type.initial; k++) {
                final VmRec r = newVmRec(ty, 0.0, 0.0);
                r.running = true;
                r.runSince = 0.0;
                typeRunning[ty]++;
            }
        }
        if (!pendingVms.isEmpty()) {
            broker.submitVmList(pendingVms);
            pendingVms.clear();
        }
        sim.startSync();
        waker.wakeAt(FAR_FUTURE); // keep-alive: the future-event queue never empties
        waker.wakeAt(0.0);
        int calls = 0;
        while (sim.clock() < EPOCH - EPS) {
            if (++calls > MAX_RUNFOR_CALLS) {
                throw new IllegalStateException("reset did not reach the epoch");
            }
            sim.runFor(EPOCH - sim.clock());
            settle();
        }
        if (!broker.getVmWaitingList().isEmpty()) {
            throw new IllegalStateException("initial VMs still waiting for creation in the broker");
        }
        finishedBuf.clear();
        for (VmRec r : live) {
            if (!r.vm.isCreated()) {
                throw new IllegalStateException("initial VM " + r.seq + " could not be created in CloudSim Plus");
            }
        }
        isReset = true;

        // ---- snapshot at clock 0
        t0 = t1 = 0.0;
        waitInt = busyInt = 0;
        submittedInterval = 0;
        intervalFirstJob = 0;
        actionApplied = false;
        for (VmRec r : live) {
            r.busyInt = 0;
            r.lastT = 0;
        }
        fillSnapshot(0.0);
    }

    private static long ramMb(double gb) {
        return Math.max(1L, (long) Math.ceil(gb * 1024.0));
    }

    private VmRec newVmRec(int ty, double requestT, double bootDoneT) {
        final Config.VmType type = cfg.vmTypes.get(ty);
        final VmRec r = new VmRec();
        r.seq = vmSeq++;
        r.type = ty;
        r.cores = type.cores;
        r.requestT = requestT;
        r.bootDoneT = bootDoneT;
        r.running = false;
        r.runSince = Double.NaN;
        r.lastT = requestT;
        final VmSimple vm = new VmSimple(cfg.hostMips, type.cores);
        // NOTE: CloudSim Plus 8.5.7's VmAbstract constructor overwrites a scheduler passed to the constructor
        // with CloudletSchedulerTimeShared (mutableAttributesInit runs after it); set it afterwards.
        vm.setCloudletScheduler(new SpaceShared());
        vm.setId(r.seq);
        vm.setRam(ramMb(type.ramGb)).setBw(1).setSize(1);
        r.vm = vm;
        live.add(r);
        pendingVms.add(vm);
        return r;
    }

    // ================================================================== step
    /**
     * Advances one step applying the action row {@code actions[off .. off+nTypes)}.
     */
    void step(byte[] actions, int off) {
        if (!isReset) {
            throw new IllegalStateException("env stepped before reset");
        }
        try {
            advance(actions, off);
        } catch (RuntimeException | Error e) {
            isReset = false; // half a step: our records and CloudSim's no longer agree
            throw e;
        }
    }

    private void advance(byte[] actions, int off) {
        t0 = t;
        t1 = (stepIndex + 1) * cfg.stepSeconds;
        if (!(t1 > t0)) {
            t1 = t0 + cfg.stepSeconds;
        }
        waitInt = 0;
        busyInt = 0;
        lastIntegT = t0;
        submittedInterval = 0;
        intervalFirstJob = nextArrival;
        for (int i = 0, s = live.size(); i < s; i++) {
            final VmRec r = live.get(i);
            r.busyInt = 0;
            r.lastT = t0;
        }

        // let CloudSim Plus handle what our last dispatch at t0 queued (cloudlet submissions), so that a VM
        // killed below has its cloudlets in its scheduler, not in flight
        settle();
        if (!finishedBuf.isEmpty()) {
            processFinishes(Math.max(simNow(), lastIntegT));
        }

        actionApplied = applyActions(actions, off);

        // wake-ups at our own exact times inside (t0, t1]
        scheduleWakeups();

        processNow();
        int calls = 0;
        while (simNow() < t1 - EPS) {
            if (++calls > MAX_RUNFOR_CALLS) {
                throw new IllegalStateException("step did not reach t1=" + t1 + " (clock " + simNow() + ")");
            }
            sim.runFor((t1 + EPOCH) - sim.clock());
            processNow();
        }

        integrate(t1);
        for (int i = 0, s = live.size(); i < s; i++) {
            integrateVm(live.get(i), t1);
        }
        t = t1;
        stepIndex++;
        fillSnapshot(t1);
    }

    private void scheduleWakeups() {
        final double now = simNow();
        double last = Double.NaN;
        for (int j = nextArrival; j < n; j++) {
            final double a = wl.arrival[j];
            if (a >= t1) break;
            if (a > now + EPS && a != last) {
                waker.wakeAt(a);
                last = a;
            }
        }
        for (int i = 0, s = live.size(); i < s; i++) {
            final VmRec r = live.get(i);
            if (!r.running && r.bootDoneT > now + EPS && r.bootDoneT <= t1) {
                waker.wakeAt(r.bootDoneT);
            }
        }
        waker.wakeAt(t1);
    }

    /** The CloudSim clock in workload time. */
    private double simNow() {
        return sim.clock() - EPOCH;
    }

    /** Lets CloudSim Plus handle every event up to the current clock. */
    private void settle() {
        for (int i = 0; i < MAX_RUNFOR_CALLS; i++) {
            final long before = sim.moved;
            sim.runFor(0);
            if (sim.moved == before) {
                return;
            }
        }
        throw new IllegalStateException("CloudSim Plus did not settle at clock " + sim.clock());
    }

    /** Settles the simulation at the current clock and applies our logic at that time. */
    private void processNow() {
        settle();
        final double now = Math.max(simNow(), lastIntegT);
        integrate(now);

        // 1. finished cloudlets (recorded by the onFinish listener while CloudSim handled the events)
        if (!finishedBuf.isEmpty()) {
            processFinishes(now);
        }

        // 2. boot completions
        for (int i = 0, s = live.size(); i < s; i++) {
            final VmRec r = live.get(i);
            if (!r.running && r.bootDoneT <= now + EPS && r.vm.isCreated()) {
                r.running = true;
                r.runSince = now;
                r.lastT = now;
                typeBooting[r.type]--;
                typeRunning[r.type]++;
            }
        }

        // 3. arrivals in [t0, t1) up to now
        while (nextArrival < n) {
            final double a = wl.arrival[nextArrival];
            if (a >= t1 || a > now + EPS) break;
            final int j = nextArrival++;
            jState[j] = QUEUED;
            jEnq[j] = now;
            queue.add(j);
            queuedCores += wl.cores[j];
            submittedInterval++;
        }

        // 4. dispatch
        dispatch(now);
    }

    private void processFinishes(double now) {
        integrate(now);
        for (int i = 0, s = finishedBuf.size(); i < s; i++) {
            finishJob(finishedBuf.get(i), now);
        }
        finishedBuf.clear();
    }

    private void integrate(double now) {
        final double dt = now - lastIntegT;
        if (dt > 0) {
            waitInt += queue.size() * dt;
            busyInt += runCores * dt;
            lastIntegT = now;
        }
    }

    private static void integrateVm(VmRec r, double now) {
        final double dt = now - r.lastT;
        if (dt > 0) {
            r.busyInt += r.used * dt;
            r.lastT = now;
        }
    }

    private void onCloudletFinish(CloudletVmEventInfo info) {
        final Cloudlet c = info.getCloudlet();
        if (c instanceof JobCloudlet jc && jCl[jc.job] == jc) {
            finishedBuf.add(jc.job);
        }
    }

    private void finishJob(int j, double now) {
        final VmRec r = jVm[j];
        if (r == null || jState[j] != RUNNING) {
            return;
        }
        final int c = wl.cores[j];
        integrateVm(r, now);
        r.used -= c;
        r.ramUsed -= wl.ramGb[j];
        if (r.jobs.size() == 1) {
            r.ramUsed = 0; // avoid floating residue
        }
        r.jobs.removeValue(j);
        runCores -= c;
        running--;
        finished++;
        jState[j] = FINISHED;
        jFinish[j] = now;
        jVm[j] = null;
        jCl[j] = null;
    }

    /** Strict FIFO (head of line), best fit (fewest free cores that fit; ties: oldest VM). */
    private void dispatch(double now) {
        while (!queue.isEmpty()) {
            final int j = queue.peek();
            final int c = wl.cores[j];
            VmRec best = null;
            int bestFree = Integer.MAX_VALUE;
            for (int i = 0, s = live.size(); i < s; i++) {
                final VmRec r = live.get(i);
                if (!r.running) continue;
                final int free = r.cores - r.used;
                if (free >= c && free < bestFree) {
                    best = r;
                    bestFree = free;
                }
            }
            if (best == null) break;
            queue.poll();
            queuedCores -= c;
            startJob(j, best, now);
        }
        if (!pendingCloudlets.isEmpty()) {
            broker.submitCloudletList(pendingCloudlets);
            pendingCloudlets.clear();
        }
    }

    private void startJob(int j, VmRec r, double now) {
        final int c = wl.cores[j];
        integrateVm(r, now);
        r.used += c;
        r.ramUsed += wl.ramGb[j];
        r.jobs.add(j);
        runCores += c;
        running++;
        jWait[j] += now - jEnq[j];
        jStart[j] = now;
        jState[j] = RUNNING;
        jVm[j] = r;
        // the workload gives MI per core (every core of the job runs that long), as CloudSim Plus
        // takes a cloudlet's length per PE
        final long perPe = Math.max(1L, Math.round(wl.lengthMi[j]));
        final JobCloudlet cl = new JobCloudlet(j, perPe, c, cpuModel);
        cl.setUtilizationModelRam(UtilizationModel.NULL);
        cl.setUtilizationModelBw(UtilizationModel.NULL);
        cl.setId(cloudletSeq++);
        cl.setVm(r.vm);
        cl.addOnFinishListener(finishListener);
        jCl[j] = cl;
        pendingCloudlets.add(cl);
    }

    // ================================================================== actions
    private boolean applyActions(byte[] actions, int off) {
        if (t0 < lastAppliedActionTime + cfg.cooldownS) {
            return false; // cool-down: blocked entirely
        }
        boolean any = false;
        // removals first (so that a removal never hits a VM requested in this same step)
        for (int ty = 0; ty < nTypes; ty++) {
            final int d = actions[off + ty];
            if (d >= 0) continue;
            final Config.VmType type = cfg.vmTypes.get(ty);
            final int count = typeRunning[ty] + typeBooting[ty];
            final int k = Math.min(-d, count - type.min);
            for (int i = 0; i < k; i++) {
                removeVm(chooseVictim(ty), t0);
                any = true;
            }
        }
        for (int ty = 0; ty < nTypes; ty++) {
            final int d = actions[off + ty];
            if (d <= 0) continue;
            final Config.VmType type = cfg.vmTypes.get(ty);
            final int count = typeRunning[ty] + typeBooting[ty];
            final int k = Math.min(d, type.max - count);
            for (int i = 0; i < k; i++) {
                final double delay = cfg.bootDelayMaxS > cfg.bootDelayMinS
                    ? rng.nextDouble(cfg.bootDelayMinS, cfg.bootDelayMaxS)
                    : cfg.bootDelayMinS;
                newVmRec(ty, t0, t0 + delay);
                typeBooting[ty]++;
                any = true;
            }
        }
        if (!pendingVms.isEmpty()) {
            broker.submitVmList(pendingVms);
            pendingVms.clear();
            settle();
            for (int i = live.size() - 1; i >= 0 && live.get(i).requestT == t0; i--) {
                if (!live.get(i).vm.isCreated()) {
                    throw new IllegalStateException("CloudSim Plus could not create VM " + live.get(i).seq);
                }
            }
        }
        if (any) {
            lastAppliedActionTime = t0;
        }
        return any;
    }

    /** Booting (newest first), else idle running (newest first), else least lost work (ties: newest). */
    private VmRec chooseVictim(int ty) {
        VmRec booting = null, idle = null, least = null;
        double leastLoss = Double.POSITIVE_INFINITY;
        for (int i = live.size() - 1; i >= 0; i--) { // newest first
            final VmRec r = live.get(i);
            if (r.type != ty) continue;
            if (!r.running) {
                if (booting == null) booting = r;
                continue;
            }
            if (r.jobs.isEmpty()) {
                if (idle == null) idle = r;
                continue;
            }
            double loss = 0;
            for (int k = 0, s = r.jobs.size(); k < s; k++) {
                final int j = r.jobs.get(k);
                loss += (t0 - jStart[j]) * wl.cores[j];
            }
            if (loss < leastLoss) {
                leastLoss = loss;
                least = r;
            }
        }
        if (booting != null) return booting;
        if (idle != null) return idle;
        if (least == null) throw new IllegalStateException("no VM of type " + ty + " to remove");
        return least;
    }

    private void removeVm(VmRec r, double now) {
        integrate(now);
        integrateVm(r, now);
        final VmSimple vm = r.vm;
        // re-queue its jobs (they restart from zero and wait again), in order of original arrival
        for (int k = 0, s = r.jobs.size(); k < s; k++) {
            final int j = r.jobs.get(k);
            final JobCloudlet cl = jCl[j];
            if (cl != null) {
                vm.getCloudletScheduler().cloudletCancel(cl);
            }
            final int c = wl.cores[j];
            lostCoreSec += (now - jStart[j]) * c;
            runCores -= c;
            running--;
            jState[j] = QUEUED;
            jEnq[j] = now;
            jRestarts[j]++;
            requeuedTotal++;
            jVm[j] = null;
            jCl[j] = null;
            queue.add(j);
            queuedCores += wl.cores[j];
        }
        r.jobs.clear();
        r.used = 0;
        r.ramUsed = 0;
        if (vm.isCreated()) {
            // immediate kill (broker.destroyVm is gone in 8.4+): free the host now
            dc.getVmAllocationPolicy().deallocateHostForVm(vm);
        }
        if (r.running) typeRunning[r.type]--;
        else typeBooting[r.type]--;
        live.remove(r);
    }

    // ================================================================== snapshot
    private void fillSnapshot(double now) {
        final double[] s = snap;
        final int nt = nTypes;
        s[0] = now;
        s[1] = stepIndex;
        s[2] = finished == n ? 1 : 0;
        s[3] = actionApplied ? 1 : 0;
        s[4] = now < lastAppliedActionTime + cfg.cooldownS ? 1 : 0;
        s[5] = nextArrival;
        s[6] = submittedInterval;
        s[7] = queue.size();
        int waitingInterval = 0;
        for (int j = intervalFirstJob; j < nextArrival; j++) {
            if (jState[j] == QUEUED) waitingInterval++;
        }
        s[8] = waitingInterval;
        s[9] = finished;
        s[10] = running;
        double cost = 0;
        final double dtStep = t1 - t0;
        for (int i = 0, m = live.size(); i < m; i++) {
            final VmRec r = live.get(i);
            final double from = Math.max(t0, r.requestT);
            if (t1 > from) {
                cost += cfg.vmTypes.get(r.type).pricePerHour / 3600.0 * (t1 - from);
            }
        }
        s[11] = dtStep > 0 ? cost : 0;
        s[12] = waitInt;
        s[13] = requeuedTotal;
        s[14] = busyInt;
        s[15] = lostCoreSec;
        // what queue-based rules see: work in cores, head-of-line blocking, time since the last action
        s[16] = queuedCores;
        s[17] = runCores;
        s[18] = queue.isEmpty() ? 0 : wl.cores[queue.peek()];
        int maxFree = 0;
        for (int i = 0, m = live.size(); i < m; i++) {
            final VmRec r = live.get(i);
            if (r.running && r.cores - r.used > maxFree) maxFree = r.cores - r.used;
        }
        s[19] = maxFree;
        s[20] = lastAppliedActionTime == Double.NEGATIVE_INFINITY ? -1.0 : Math.max(0.0, now - lastAppliedActionTime);
        int o = Config.HEADER_DOUBLES;
        for (int ty = 0; ty < nt; ty++) {
            final Config.VmType type = cfg.vmTypes.get(ty);
            final int count = typeRunning[ty] + typeBooting[ty];
            s[o++] = typeRunning[ty];
            s[o++] = typeBooting[ty];
            s[o++] = count < type.max ? 1 : 0;
            s[o++] = count > type.min ? 1 : 0;
        }
        final int nv = live.size();
        for (int i = 0; i < cfg.nSlots; i++) {
            if (i < nv) {
                final VmRec r = live.get(i);
                s[o++] = r.type;
                s[o++] = r.running ? 1 : 0;
                if (r.running) {
                    final double runT = now - Math.max(t0, r.runSince);
                    s[o++] = runT > EPS ? r.busyInt / (r.cores * runT) : 0.0;
                } else {
                    s[o++] = 0.0;
                }
                s[o++] = r.ramUsed;
                s[o++] = r.running ? now - r.runSince : -1.0;
            } else {
                s[o++] = -1.0;
                s[o++] = 0.0;
                s[o++] = 0.0;
                s[o++] = 0.0;
                s[o++] = 0.0;
            }
        }
    }

    // ================================================================== job stats
    double[] jobStats() {
        final double[] out = new double[n * 5];
        for (int j = 0; j < n; j++) {
            final int o = j * 5;
            out[o] = wl.arrival[j];
            out[o + 1] = jStart[j];
            out[o + 2] = jFinish[j];
            out[o + 3] = jWait[j] + (jState[j] == QUEUED ? Math.max(0.0, t - jEnq[j]) : 0.0);
            out[o + 4] = jRestarts[j];
        }
        return out;
    }

    // test hooks
    double clock() {
        return t;
    }

    /** VMs placed on the CloudSim hosts (must equal our live VMs: no zombies, no leaks). */
    int cloudSimVmsOnHosts() {
        int k = 0;
        for (Host h : dc.getHostList()) {
            k += h.getVmList().size();
        }
        return k;
    }

    double cloudSimClock() {
        return simNow();
    }

    int liveVms() {
        return live.size();
    }
}
