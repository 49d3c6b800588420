// The Python module object of the plugin's custom-op library.
//
// Importing vllm_ascend_ext._C_ascend_ext loads this shared object; the static
// TORCH_LIBRARY / TORCH_LIBRARY_IMPL blocks in registration.cpp then register the
// ops under torch.ops._C_ascend_ext. The module itself exposes nothing.
#include <Python.h>

static struct PyModuleDef ascend_ext_module = {
    PyModuleDef_HEAD_INIT, "_C_ascend_ext",
    "vllm-ascend-ext custom ops (torch.ops._C_ascend_ext)", -1, nullptr};

PyMODINIT_FUNC PyInit__C_ascend_ext(void) { return PyModule_Create(&ascend_ext_module); }
