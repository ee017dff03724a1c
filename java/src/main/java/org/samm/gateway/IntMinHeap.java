package org.samm.gateway;

import java.util.Arrays;

/** A growable binary min-heap of ints (the FIFO queue, keyed by job index = arrival order). */
final class IntMinHeap {
    private int[] a = new int[64];
    private int size;

    int size() { return size; }

    boolean isEmpty() { return size == 0; }

    void clear() { size = 0; }

    int peek() { return a[0]; }

    void add(int v) {
        if (size == a.length) a = Arrays.copyOf(a, size * 2);
        int i = size++;
        while (i > 0) {
            final int p = (i - 1) >>> 1;
            if (a[p] <= v) break;
            a[i] = a[p];
            i = p;
        }
        a[i] = v;
    }

    int poll() {
        final int top = a[0];
        final int last = a[--size];
        int i = 0;
        final int half = size >>> 1;
        while (i < half) {
            int c = 2 * i + 1;
            final int r = c + 1;
            if (r < size && a[r] < a[c]) c = r;
            if (last <= a[c]) break;
            a[i] = a[c];
            i = c;
        }
        if (size > 0) a[i] = last;
        return top;
    }
}
