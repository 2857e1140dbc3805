/* The nesting model (_nesting.c), part of the _native module. */
#ifndef STREAM_DEDUP_NESTING_H
#define STREAM_DEDUP_NESTING_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>

int nesting_init(void);
PyObject *nesting_depth(PyObject *self, PyObject *args);
PyObject *too_deep(PyObject *self, PyObject *args);

#endif
