/* The nesting model (_nesting.c), part of the _native module. */
#ifndef STREAM_DEDUP_NESTING_H
#define STREAM_DEDUP_NESTING_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(__GNUC__)
#define NESTING_INTERNAL __attribute__((visibility("hidden"))) /* (see _native.h) */
#else
#define NESTING_INTERNAL
#endif

NESTING_INTERNAL int nesting_init(void);
NESTING_INTERNAL PyObject *nesting_depth(PyObject *self, PyObject *args);
NESTING_INTERNAL PyObject *too_deep(PyObject *self, PyObject *args);

#endif
