package org.samm.gateway;

import ch.qos.logback.classic.Level;
import org.cloudsimplus.util.Log;

/** CloudSim Plus logging level (its bundled logback config logs INFO, which costs 25-45 % of the run time). */
final class Logging {
    private static volatile boolean configured;

    private Logging() {
    }

    /** WARN by default, OFF when quiet. */
    static synchronized void configure(boolean quiet) {
        Log.setLevel(quiet ? Level.OFF : Level.WARN);
        configured = true;
    }

    static void ensureConfigured() {
        if (!configured) {
            configure(false);
        }
    }
}
