// comm_inproc: the in-process communicator — expert-parallel CPU ranks as
// threads of one process, exchanging MoE rows through shared memory.
#ifndef MOESERVE_MODEL_CPU_COMM_INPROC_H
#define MOESERVE_MODEL_CPU_COMM_INPROC_H

#include <stddef.h>

#include "model/comm.h"

// Creates one group of n_ranks endpoints: out[r] is rank r's communicator,
// to be used by exactly one thread. Each endpoint is released with its
// ops->destroy; the group goes when the last one does.
int comm_inproc_create(int n_ranks, struct comm **out, char *err, size_t errlen);

#endif
