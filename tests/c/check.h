/*
 * check.h: the counting CHECK of iopath's C tests. Define CHECK_CONTEXT() (a
 * statement that prints what else explains a failure) before including it.
 * A test prints "N passed, M failed" at the end (the line CI reads).
 */
#ifndef IOPATH_CHECK_H
#define IOPATH_CHECK_H
#include <stdio.h>

static int passed, failed;

#define CHECK(cond, ...)                                                      \
    do {                                                                      \
        if (cond) {                                                           \
            passed++;                                                         \
        } else {                                                              \
            failed++;                                                         \
            fprintf(stderr, "FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                     \
            CHECK_CONTEXT();                                                  \
            fprintf(stderr, "\n");                                            \
        }                                                                     \
    } while (0)

#endif
