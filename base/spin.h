// spin: the waits the compute threads and the in-process communicator share
// — a pause for short spins, and Linux futexes on a 32-bit counter for the
// long ones (private to the process).
#ifndef MOESERVE_BASE_SPIN_H
#define MOESERVE_BASE_SPIN_H

#include <stdatomic.h>
#include <stdint.h>

// One spin-loop iteration: tells the core (and its sibling thread) that we wait.
static inline void ms_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    __asm__ __volatile__("" ::: "memory");
#endif
}

// Sleeps while *addr == val (returns at once when it differs, and may
// return spuriously: callers re-check in a loop).
void ms_futex_wait(_Atomic uint32_t *addr, uint32_t val);
// Wakes up to n threads sleeping on addr (INT32_MAX: all).
void ms_futex_wake(_Atomic uint32_t *addr, int n);

#endif
