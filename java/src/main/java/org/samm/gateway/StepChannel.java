package org.samm.gateway;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.util.HexFormat;
import java.util.function.IntFunction;

/**
 * The hot path of the bridge beside Py4J: a plain loopback TCP socket that carries batched
 * steps as raw frames, with no Py4J command parsing, string escaping or Base64 (together they
 * cost more than stepping 8 simulations). Control calls (create, reset, close) stay on Py4J.
 *
 * Protocol (big-endian ints): the client first sends the 32-character hex token it got from
 * {@code Gateway.openStepChannel()}; then per step it sends {@code int batchId, int length,
 * byte[length] actions} and receives {@code int status, int length, byte[length]} where status
 * 0 carries the packed snapshots and status 1 a UTF-8 error message.
 */
final class StepChannel implements AutoCloseable {
    private final ServerSocket server;
    private final String token;
    private final IntFunction<Batch> batches;

    StepChannel(String address, IntFunction<Batch> batches) throws IOException {
        this.batches = batches;
        final byte[] raw = new byte[16];
        new SecureRandom().nextBytes(raw);
        this.token = HexFormat.of().formatHex(raw);
        this.server = new ServerSocket(0, 8, InetAddress.getByName(address));
        final Thread acceptor = new Thread(this::acceptLoop, "samm-step-channel");
        acceptor.setDaemon(true);
        acceptor.start();
    }

    int port() {
        return server.getLocalPort();
    }

    String token() {
        return token;
    }

    private void acceptLoop() {
        while (!server.isClosed()) {
            try {
                final Socket s = server.accept();
                s.setTcpNoDelay(true);
                final Thread t = new Thread(() -> serve(s), "samm-step-conn");
                t.setDaemon(true);
                t.start();
            } catch (IOException e) {
                return; // closed
            }
        }
    }

    private void serve(Socket s) {
        try (s;
             DataInputStream in = new DataInputStream(new BufferedInputStream(s.getInputStream(), 1 << 16));
             DataOutputStream out = new DataOutputStream(new BufferedOutputStream(s.getOutputStream(), 1 << 16))) {
            final byte[] presented = new byte[32];
            in.readFully(presented);
            if (!token.equals(new String(presented, StandardCharsets.US_ASCII))) {
                return; // not our client: drop the connection
            }
            while (true) {
                final int batchId;
                try {
                    batchId = in.readInt();
                } catch (EOFException eof) {
                    return;
                }
                final int len = in.readInt();
                if (len < 0 || len > (1 << 24)) {
                    throw new IOException("bad frame length " + len);
                }
                final byte[] actions = new byte[len];
                in.readFully(actions);
                byte[] reply;
                int status = 0;
                try {
                    final Batch b = batches.apply(batchId);
                    reply = b.step(actions);
                } catch (RuntimeException e) {
                    status = 1;
                    reply = String.valueOf(e.getMessage()).getBytes(StandardCharsets.UTF_8);
                }
                out.writeInt(status);
                out.writeInt(reply.length);
                out.write(reply);
                out.flush();
            }
        } catch (IOException e) {
            // the client went away; nothing to clean up beyond the socket
        }
    }

    @Override
    public void close() throws IOException {
        server.close();
    }
}
