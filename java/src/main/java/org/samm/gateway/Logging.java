package org.samm.gateway;

import ch.qos.logback.classic.Level;
import ch.qos.logback.classic.Logger;
import ch.qos.logback.classic.LoggerContext;
import ch.qos.logback.classic.encoder.PatternLayoutEncoder;
import ch.qos.logback.classic.spi.ILoggingEvent;
import ch.qos.logback.core.ConsoleAppender;
import org.cloudsimplus.util.Log;
import org.slf4j.LoggerFactory;

/**
 * Logging set-up. CloudSim Plus ships a logback.xml that logs DEBUG to stdout with ANSI colours: that costs
 * 25-45 % of the run time and would pollute stdout, which carries the {@code SAMM_GATEWAY_PORT=} line and may be
 * a pipe nobody drains. So: level WARN (OFF when quiet), one plain appender on stderr.
 */
final class Logging {
    private static volatile boolean configured;

    private Logging() {
    }

    static synchronized void configure(boolean quiet) {
        if (LoggerFactory.getILoggerFactory() instanceof LoggerContext ctx) {
            final Logger root = ctx.getLogger(org.slf4j.Logger.ROOT_LOGGER_NAME);
            root.detachAndStopAllAppenders();
            final PatternLayoutEncoder enc = new PatternLayoutEncoder();
            enc.setContext(ctx);
            enc.setPattern("%-5level %logger{0}: %msg%n");
            enc.start();
            final ConsoleAppender<ILoggingEvent> app = new ConsoleAppender<>();
            app.setContext(ctx);
            app.setName("SAMM_STDERR");
            app.setTarget("System.err");
            app.setEncoder(enc);
            app.start();
            root.addAppender(app);
        }
        Log.setLevel(quiet ? Level.OFF : Level.WARN);
        configured = true;
    }

    static void ensureConfigured() {
        if (!configured) {
            configure(false);
        }
    }
}
