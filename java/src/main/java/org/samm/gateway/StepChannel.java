package org.samm.gateway;

import java.io.EOFException;
import java.io.IOException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.StandardSocketOptions;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.DoubleBuffer;
import java.nio.channels.ServerSocketChannel;
import java.nio.channels.SocketChannel;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.HexFormat;
import java.util.function.IntFunction;

/**
 * The hot path of the bridge beside Py4J: a plain loopback TCP socket that carries batched
 * steps and resets as raw frames, with no Py4J command parsing, string escaping or Base64
 * (together they cost more than stepping 8 simulations). Control calls (create, close) stay on
 * Py4J.
 *
 * Protocol (big-endian ints): the client first sends the 32-character hex token it got from
 * {@code Gateway.openStepChannel()}; then per call it sends {@code int op, int batchId, int length,
 * byte[length] payload} (op 1 = step with int8 actions, op 2 = reset with the reset request) and
 * receives {@code int status, int length, byte[length]} where status 0 carries the packed
 * snapshots and status 1 a UTF-8 error message.
 *
 * Both directions go through direct buffers: a step's snapshots are written straight into the
 * reply buffer and leave in one write, so a reply costs one system call and no copy on the heap.
 */
final class StepChannel implements AutoCloseable {
    static final int OP_STEP = 1;
    static final int OP_RESET = 2;
    private static final int MAX_FRAME = 1 << 24;

    private final ServerSocketChannel server;
    private final String token;
    private final IntFunction<Batch> batches;

    StepChannel(String address, IntFunction<Batch> batches) throws IOException {
        this.batches = batches;
        final byte[] raw = new byte[16];
        new SecureRandom().nextBytes(raw);
        this.token = HexFormat.of().formatHex(raw);
        this.server = ServerSocketChannel.open();
        server.bind(new InetSocketAddress(InetAddress.getByName(address), 0), 8);
        final Thread acceptor = new Thread(this::acceptLoop, "samm-step-channel");
        acceptor.setDaemon(true);
        acceptor.start();
    }

    int port() {
        return server.socket().getLocalPort();
    }

    String token() {
        return token;
    }

    private void acceptLoop() {
        while (server.isOpen()) {
            try {
                final SocketChannel s = server.accept();
                s.setOption(StandardSocketOptions.TCP_NODELAY, true);
                final Thread t = new Thread(() -> serve(s), "samm-step-conn");
                t.setDaemon(true);
                t.start();
            } catch (IOException e) {
                return; // closed
            }
        }
    }

    /** Reads until {@code in} holds at least {@code n} unread bytes (in is in read mode). */
    private static ByteBuffer fill(SocketChannel s, ByteBuffer in, int n) throws IOException {
        if (in.remaining() >= n) {
            return in;
        }
        if (in.capacity() < n) {
            final ByteBuffer grown = ByteBuffer.allocateDirect(Math.max(n, in.capacity() * 2));
            grown.put(in);
            in = grown;
        } else {
            in.compact();
        }
        while (in.position() < n) {
            if (s.read(in) < 0) {
                throw new EOFException();
            }
        }
        in.flip();
        return in;
    }

    private void serve(SocketChannel s) {
        try (s) {
            ByteBuffer in = ByteBuffer.allocateDirect(1 << 16);
            in.flip(); // empty, in read mode
            in = fill(s, in, 32);
            final byte[] presented = new byte[32];
            in.get(presented);
            if (!token.equals(new String(presented, StandardCharsets.US_ASCII))) {
                return; // not our client: drop the connection
            }
            final Reply reply = new Reply();
            while (true) {
                try {
                    in = fill(s, in, 12);
                } catch (EOFException eof) {
                    return;
                }
                final int op = in.getInt();
                final int batchId = in.getInt();
                final int len = in.getInt();
                if (len < 0 || len > MAX_FRAME) {
                    // the stream cannot be resynchronised: say why before dropping it, or the client
                    // only sees a closed socket and must guess that the JVM exited
                    reply.begin();
                    reply.error("bad step-channel frame length " + len + " (must be within [0, " + MAX_FRAME
                        + "]); closing the connection");
                    reply.send(s);
                    return;
                }
                in = fill(s, in, len);
                final byte[] payload = new byte[len];
                in.get(payload);
                reply.begin();
                try {
                    final Batch b = batches.apply(batchId);
                    switch (op) {
                        case OP_STEP -> b.stepInto(payload, reply.records(b.envs.length * b.recordBytes()));
                        case OP_RESET -> reply.bytes(b.reset(payload));
                        default -> throw new IllegalArgumentException("unknown step-channel op " + op);
                    }
                } catch (RuntimeException e) {
                    reply.error(String.valueOf(e.getMessage()));
                } catch (OutOfMemoryError | StackOverflowError e) {
                    // answered like any failed call: else this thread dies, the connection drops and
                    // the client can only guess that the JVM exited
                    reply.error(e + " (in the JVM serving the step channel)");
                }
                reply.send(s);
            }
        } catch (IOException e) {
            // the client went away; nothing to clean up beyond the socket
        }
    }

    /** One reply frame in a reusable direct buffer: status, length, then the payload. */
    private static final class Reply {
        private ByteBuffer buf = ByteBuffer.allocateDirect(1 << 16);
        private int status;

        void begin() {
            status = 0;
            buf.clear();
        }

        private void ensure(int payloadBytes) {
            if (buf.capacity() < 8 + payloadBytes) {
                buf = ByteBuffer.allocateDirect(Math.max(8 + payloadBytes, buf.capacity() * 2));
            }
            buf.clear();
            buf.limit(8 + payloadBytes);
            buf.position(8);
        }

        /** A little-endian double view of the payload, sized for {@code payloadBytes}. */
        DoubleBuffer records(int payloadBytes) {
            ensure(payloadBytes);
            return buf.slice(8, payloadBytes).order(ByteOrder.LITTLE_ENDIAN).asDoubleBuffer();
        }

        void bytes(byte[] payload) {
            ensure(payload.length);
            buf.put(payload);
        }

        void error(String message) {
            status = 1;
            final byte[] m = message.getBytes(StandardCharsets.UTF_8);
            ensure(m.length);
            buf.put(m);
        }

        void send(SocketChannel s) throws IOException {
            final int len = buf.limit() - 8;
            buf.putInt(0, status).putInt(4, len);
            buf.position(0);
            while (buf.hasRemaining()) {
                s.write(buf);
            }
        }
    }

    @Override
    public void close() throws IOException {
        server.close();
    }
}
