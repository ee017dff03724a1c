package org.samm.gateway;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import com.google.gson.JsonPrimitive;
import com.google.gson.Strictness;
import com.google.gson.stream.JsonReader;

import java.io.IOException;
import java.io.StringReader;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Immutable simulation configuration parsed from the JSON of {@code createBatch}
 * (see docs/bridge-protocol.md). Unknown keys are rejected with the key's name.
 */
public final class Config {

    /** One VM type. */
    public static final class VmType {
        public final String name;
        public final int cores;
        public final double ramGb;
        public final double pricePerHour;
        public final int min;
        public final int max;
        public final int initial;

        VmType(String name, int cores, double ramGb, double pricePerHour, int min, int max, int initial) {
            this.name = name;
            this.cores = cores;
            this.ramGb = ramGb;
            this.pricePerHour = pricePerHour;
            this.min = min;
            this.max = max;
            this.initial = initial;
        }
    }

    private static final Set<String> TOP_KEYS = Set.of(
        "vm_types", "host_mips", "step_seconds", "boot_delay_min_s", "boot_delay_max_s", "cooldown_s", "threads");
    private static final Set<String> TYPE_KEYS = Set.of(
        "name", "cores", "ram_gb", "price_per_hour", "min", "max", "initial");

    public final List<VmType> vmTypes;
    public final double hostMips;
    public final double stepSeconds;
    public final double bootDelayMinS;
    public final double bootDelayMaxS;
    public final double cooldownS;
    public final int threads;

    /** Number of VM types (T). */
    public final int nTypes;
    /** Number of VM slots (V = sum of max). */
    public final int nSlots;
    /** Largest number of cores of any type. */
    public final int maxCores;
    /** Largest RAM (GB) of any type. */
    public final double maxRamGb;
    /**
     * Most VM slots (sum of max) of a config: every slot is a CloudSim host and 5 doubles of every
     * snapshot, so a larger fleet only ends in an int overflow or a heap error that names nothing.
     */
    public static final int MAX_SLOTS = 100_000;
    /** Most PEs one env's hosts may have together (VM slots x largest cores), for the same reason. */
    public static final long MAX_HOST_PES = 1L << 22;
    /** Header doubles of a snapshot record (docs/bridge-protocol.md). */
    public static final int HEADER_DOUBLES = 21;
    /** Snapshot record length in doubles: 21 + 4T + 5V. */
    public final int recordDoubles;

    private Config(List<VmType> vmTypes, double hostMips, double stepSeconds, double bootMin, double bootMax,
                   double cooldownS, int threads) {
        this.vmTypes = List.copyOf(vmTypes);
        this.hostMips = hostMips;
        this.stepSeconds = stepSeconds;
        this.bootDelayMinS = bootMin;
        this.bootDelayMaxS = bootMax;
        this.cooldownS = cooldownS;
        this.threads = threads;
        this.nTypes = vmTypes.size();
        int slots = 0, mc = 0;
        double mr = 0;
        for (VmType t : vmTypes) {
            slots += t.max;
            mc = Math.max(mc, t.cores);
            mr = Math.max(mr, t.ramGb);
        }
        this.nSlots = slots;
        this.maxCores = mc;
        this.maxRamGb = mr;
        this.recordDoubles = HEADER_DOUBLES + 4 * nTypes + 5 * nSlots;
    }

    /** Parses and validates a configuration; throws IllegalArgumentException with a clear message. */
    public static Config parse(String json) {
        if (json == null) {
            throw new IllegalArgumentException("config JSON is null");
        }
        final JsonElement root;
        try {
            root = JsonParser.parseString(json);
        } catch (RuntimeException e) {
            throw new IllegalArgumentException("config is not valid JSON: " + e.getMessage(), e);
        }
        if (!root.isJsonObject()) {
            throw new IllegalArgumentException("config must be a JSON object");
        }
        checkNoRepeatedKeys(json);
        final JsonObject o = root.getAsJsonObject();
        for (Map.Entry<String, JsonElement> e : o.entrySet()) {
            if (!TOP_KEYS.contains(e.getKey())) {
                throw new IllegalArgumentException("unknown config key: '" + e.getKey() + "'");
            }
        }
        if (!o.has("vm_types")) {
            throw new IllegalArgumentException("config key 'vm_types' is required");
        }
        if (!o.get("vm_types").isJsonArray()) {
            throw new IllegalArgumentException("config key 'vm_types' must be an array");
        }
        final JsonArray arr = o.getAsJsonArray("vm_types");
        if (arr.isEmpty()) {
            throw new IllegalArgumentException("config 'vm_types' needs at least one VM type");
        }
        final List<VmType> types = new ArrayList<>();
        for (int i = 0; i < arr.size(); i++) {
            final JsonElement te = arr.get(i);
            if (!te.isJsonObject()) {
                throw new IllegalArgumentException("vm_types[" + i + "] must be an object");
            }
            final JsonObject t = te.getAsJsonObject();
            for (Map.Entry<String, JsonElement> e : t.entrySet()) {
                if (!TYPE_KEYS.contains(e.getKey())) {
                    throw new IllegalArgumentException("unknown config key: 'vm_types[" + i + "]." + e.getKey() + "'");
                }
            }
            final String where = "vm_types[" + i + "]";
            final String name = t.has("name") ? str(t.get("name"), where + ".name") : "T" + i;
            final int cores = integer(req(t, "cores", where), where + ".cores");
            final double ram = num(req(t, "ram_gb", where), where + ".ram_gb");
            final double price = num(req(t, "price_per_hour", where), where + ".price_per_hour");
            final int min = integer(req(t, "min", where), where + ".min");
            final int max = integer(req(t, "max", where), where + ".max");
            final int initial = integer(req(t, "initial", where), where + ".initial");
            if (cores < 1) throw new IllegalArgumentException(where + ".cores must be >= 1, got " + cores);
            if (!(ram >= 0)) throw new IllegalArgumentException(where + ".ram_gb must be >= 0, got " + ram);
            if (!(price >= 0)) throw new IllegalArgumentException(where + ".price_per_hour must be >= 0, got " + price);
            if (!(0 <= min && min <= initial && initial <= max)) {
                throw new IllegalArgumentException(where + ": need 0 <= min <= initial <= max, got min=" + min
                    + " initial=" + initial + " max=" + max);
            }
            types.add(new VmType(name, cores, ram, price, min, max, initial));
        }
        final double mips = o.has("host_mips") ? num(o.get("host_mips"), "host_mips") : 4400.0;
        final double step = o.has("step_seconds") ? num(o.get("step_seconds"), "step_seconds") : 60.0;
        final double bmin = o.has("boot_delay_min_s") ? num(o.get("boot_delay_min_s"), "boot_delay_min_s") : 45.0;
        final double bmax = o.has("boot_delay_max_s") ? num(o.get("boot_delay_max_s"), "boot_delay_max_s") : 97.0;
        final double cool = o.has("cooldown_s") ? num(o.get("cooldown_s"), "cooldown_s") : 0.0;
        final int threads = o.has("threads") ? integer(o.get("threads"), "threads") : 0;
        if (!(mips > 0) || Double.isInfinite(mips)) throw new IllegalArgumentException("host_mips must be > 0, got " + mips);
        if (!(step > 0) || Double.isInfinite(step)) throw new IllegalArgumentException("step_seconds must be > 0, got " + step);
        if (!(0 <= bmin && bmin <= bmax) || Double.isInfinite(bmax)) {
            throw new IllegalArgumentException("need 0 <= boot_delay_min_s <= boot_delay_max_s, got " + bmin + ", " + bmax);
        }
        if (!(cool >= 0) || Double.isInfinite(cool)) throw new IllegalArgumentException("cooldown_s must be >= 0, got " + cool);
        if (threads < 0) throw new IllegalArgumentException("threads must be >= 0, got " + threads);
        // CloudSim Plus counts PE capacity in whole MIPS: on slower PEs no VM can ever be placed
        if (mips < 1) throw new IllegalArgumentException("host_mips must be >= 1, got " + mips);
        checkFleetSize(types);
        return new Config(types, mips, step, bmin, bmax, cool, threads);
    }

    /**
     * Gson's tree keeps the last of two equal keys, so {@code "step_seconds": 60, "step_seconds": 6} ran
     * with one of them and said nothing; only the token stream still shows both.
     */
    private static void checkNoRepeatedKeys(String json) {
        final Deque<Set<String>> open = new ArrayDeque<>();
        try (JsonReader r = new JsonReader(new StringReader(json))) {
            r.setStrictness(Strictness.LENIENT); // as JsonParser read it
            while (true) {
                switch (r.peek()) {
                    case BEGIN_OBJECT -> {
                        r.beginObject();
                        open.push(new HashSet<>());
                    }
                    case END_OBJECT -> {
                        r.endObject();
                        open.pop();
                    }
                    case BEGIN_ARRAY -> r.beginArray();
                    case END_ARRAY -> r.endArray();
                    case NAME -> {
                        if (!open.peek().add(r.nextName())) {
                            final String path = r.getPath(); // "$.vm_types[0].cores"
                            throw new IllegalArgumentException("config key '"
                                + (path.startsWith("$.") ? path.substring(2) : path) + "' is given twice");
                        }
                    }
                    case END_DOCUMENT -> {
                        return;
                    }
                    default -> r.skipValue();
                }
            }
        } catch (IOException e) {
            throw new IllegalArgumentException("config is not valid JSON: " + e.getMessage(), e);
        }
    }

    private static void checkFleetSize(List<VmType> types) {
        long slots = 0;
        int cores = 0;
        for (VmType t : types) {
            slots += t.max;
            cores = Math.max(cores, t.cores);
        }
        if (slots > MAX_SLOTS) {
            throw new IllegalArgumentException("vm_types: the sum of max (VM slots) must be <= " + MAX_SLOTS
                + ", got " + slots);
        }
        if (Math.max(1, slots) * cores > MAX_HOST_PES) {
            throw new IllegalArgumentException("vm_types: VM slots x largest cores must be <= " + MAX_HOST_PES
                + " simulated PEs, got " + Math.max(1, slots) + " x " + cores);
        }
    }

    /** Checks that every job fits the largest VM type. */
    public void checkWorkload(Workload w) {
        for (int j = 0; j < w.n; j++) {
            if (w.cores[j] > maxCores) {
                throw new IllegalArgumentException("job " + j + " needs " + w.cores[j]
                    + " cores but the largest VM type has " + maxCores);
            }
        }
    }

    private static JsonElement req(JsonObject o, String key, String where) {
        if (!o.has(key)) {
            throw new IllegalArgumentException("config key '" + where + "." + key + "' is required");
        }
        return o.get(key);
    }

    private static double num(JsonElement e, String key) {
        if (e != null && e.isJsonPrimitive() && ((JsonPrimitive) e).isNumber()) {
            final double v = e.getAsDouble();
            if (Double.isNaN(v)) throw new IllegalArgumentException("config key '" + key + "' is NaN");
            return v;
        }
        throw new IllegalArgumentException("config key '" + key + "' must be a number, got " + e);
    }

    private static int integer(JsonElement e, String key) {
        final double v = num(e, key);
        if (v != Math.rint(v) || Math.abs(v) > Integer.MAX_VALUE) {
            throw new IllegalArgumentException("config key '" + key + "' must be an integer, got " + e);
        }
        return (int) v;
    }

    private static String str(JsonElement e, String key) {
        if (e != null && e.isJsonPrimitive() && ((JsonPrimitive) e).isString()) {
            return e.getAsString();
        }
        throw new IllegalArgumentException("config key '" + key + "' must be a string, got " + e);
    }
}
