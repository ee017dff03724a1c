package org.samm.gateway;

import java.util.Arrays;

/** A minimal growable list of ints. */
final class IntList {
    private int[] a;
    private int size;

    IntList() { this(8); }

    IntList(int cap) { a = new int[Math.max(1, cap)]; }

    int size() { return size; }

    boolean isEmpty() { return size == 0; }

    int get(int i) { return a[i]; }

    void clear() { size = 0; }

    void add(int v) {
        if (size == a.length) a = Arrays.copyOf(a, size * 2);
        a[size++] = v;
    }

    /** Removes the first occurrence of v (order of the rest is kept); returns false if absent. */
    boolean removeValue(int v) {
        for (int i = 0; i < size; i++) {
            if (a[i] == v) {
                System.arraycopy(a, i + 1, a, i, size - i - 1);
                size--;
                return true;
            }
        }
        return false;
    }
}
