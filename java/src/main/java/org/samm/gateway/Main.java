package org.samm.gateway;

import py4j.GatewayServer;

import javax.net.ServerSocketFactory;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.Optional;

/**
 * {@code java -jar samm-gateway.jar --address 127.0.0.1 --port 0 --parent-pid <pid> [--quiet]}
 *
 * <p>Starts a Py4J GatewayServer (entry point {@link Gateway}) bound to the given address, with TCP_NODELAY on
 * every accepted socket, prints {@code SAMM_GATEWAY_PORT=<port>} and exits (status 0) when stdin reaches EOF
 * or the parent process exits.</p>
 */
public final class Main {
    /** Environment variable holding the token a Py4J client must present (none: no check). */
    static final String AUTH_TOKEN_ENV = "SAMM_GATEWAY_AUTH_TOKEN";

    private Main() {
    }

    /** A ServerSocket whose accepted sockets have TCP_NODELAY (py4j otherwise stalls ~44 ms on replies > ~8 KB). */
    static final class NoDelayServerSocket extends ServerSocket {
        NoDelayServerSocket() throws IOException {
            super();
        }

        @Override
        public Socket accept() throws IOException {
            final Socket s = super.accept();
            s.setTcpNoDelay(true);
            return s;
        }
    }

    static final class NoDelayServerSocketFactory extends ServerSocketFactory {
        @Override
        public ServerSocket createServerSocket() throws IOException {
            return new NoDelayServerSocket();
        }

        @Override
        public ServerSocket createServerSocket(int port) throws IOException {
            final ServerSocket s = new NoDelayServerSocket();
            s.bind(new InetSocketAddress(port));
            return s;
        }

        @Override
        public ServerSocket createServerSocket(int port, int backlog) throws IOException {
            final ServerSocket s = new NoDelayServerSocket();
            s.bind(new InetSocketAddress(port), backlog);
            return s;
        }

        @Override
        public ServerSocket createServerSocket(int port, int backlog, InetAddress addr) throws IOException {
            final ServerSocket s = new NoDelayServerSocket();
            s.bind(new InetSocketAddress(addr, port), backlog);
            return s;
        }
    }

    public static void main(String[] args) {
        String address = "127.0.0.1";
        int port = 0;
        long parentPid = -1;
        boolean quiet = false;
        for (int i = 0; i < args.length; i++) {
            final String a = args[i];
            switch (a) {
                case "--address" -> address = value(args, ++i, a);
                case "--port" -> port = (int) number(value(args, ++i, a), a, Integer.MIN_VALUE, Integer.MAX_VALUE);
                case "--parent-pid" -> parentPid = number(value(args, ++i, a), a, Long.MIN_VALUE, Long.MAX_VALUE);
                case "--quiet" -> quiet = true;
                case "--help", "-h" -> {
                    System.out.println("usage: java -jar samm-gateway.jar [--address 127.0.0.1] [--port 0] "
                        + "[--parent-pid PID] [--quiet]");
                    return;
                }
                default -> fail("unknown argument: " + a);
            }
        }
        if (port < 0 || port > 65535) {
            fail("--port must be in [0, 65535], got " + port);
        }
        Logging.configure(quiet);

        final InetAddress addr;
        try {
            addr = InetAddress.getByName(address);
        } catch (IOException e) {
            fail("cannot resolve --address " + address + ": " + e.getMessage());
            return;
        }
        if (addr.isAnyLocalAddress()) {
            fail("refusing to bind to the wildcard address " + address + "; use a loopback address");
        }
        // Py4J lets any client that reaches the port call into the JVM: an address other hosts can
        // reach (a LAN interface) would hand them this process
        if (!addr.isLoopbackAddress()) {
            fail("refusing to bind to the non-loopback address " + address + "; use a loopback address");
        }

        final Gateway entry = new Gateway();
        entry.setChannelAddress(addr.getHostAddress());
        final GatewayServer.GatewayServerBuilder builder = new GatewayServer.GatewayServerBuilder(entry)
            .javaAddress(addr)
            .javaPort(port)
            .serverSocketFactory(new NoDelayServerSocketFactory());
        // Py4J runs whatever a client asks (its reflection reaches the whole JVM) and every local user can
        // reach a loopback port; the token comes in the environment, which other users cannot read
        final String authToken = System.getenv(AUTH_TOKEN_ENV);
        if (authToken != null && !authToken.isEmpty()) {
            builder.authToken(authToken);
        }
        final GatewayServer server = builder.build();
        try {
            server.start(true);
        } catch (RuntimeException e) {
            // else main dies with a stack trace while py4j's threads keep the JVM alive, with no port
            // line and no stdin or parent watch: an orphan for ever
            fail("cannot listen on " + addr.getHostAddress() + ":" + port + " ("
                + (e.getCause() != null ? e.getCause() : e) + ")");
        }
        final int actual = server.getListeningPort();
        if (actual <= 0) {
            fail("the gateway server did not start (port " + actual + ")");
        }

        if (parentPid > 0) {
            final Optional<ProcessHandle> parent = ProcessHandle.of(parentPid);
            if (parent.isEmpty() || !parent.get().isAlive()) {
                System.err.println("samm-gateway: parent process " + parentPid + " is gone; exiting");
                System.exit(0);
            }
            parent.get().onExit().thenRun(() -> {
                System.err.println("samm-gateway: parent process exited; exiting");
                System.exit(0);
            });
        }

        final PrintStream out = System.out;
        out.println("SAMM_GATEWAY_PORT=" + actual);
        out.flush();

        // exit when stdin reaches EOF (the parent holds the pipe)
        final InputStream in = System.in;
        final byte[] buf = new byte[256];
        try {
            while (in.read(buf) != -1) {
                // ignore input
            }
        } catch (IOException e) {
            // treat as EOF
        }
        System.exit(0);
    }

    private static String value(String[] args, int i, String flag) {
        if (i >= args.length) {
            fail("missing value for " + flag);
        }
        return args[i];
    }

    /** An integral flag value in [lo, hi]; anything else is a one-line usage error, not a stack trace. */
    private static long number(String text, String flag, long lo, long hi) {
        try {
            final long v = Long.parseLong(text.trim());
            if (v >= lo && v <= hi) {
                return v;
            }
        } catch (NumberFormatException e) {
            // reported below
        }
        fail(flag + " must be an integer, got '" + text + "'");
        return 0; // not reached: fail exits
    }

    private static void fail(String msg) {
        System.err.println("samm-gateway: " + msg);
        System.exit(2);
    }
}
