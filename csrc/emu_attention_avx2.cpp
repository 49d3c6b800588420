// The FIA emulation kernel, AVX2 + FMA path (built with -mavx2 -mfma on x86-64 only;
// chosen at run time when the CPU has both, see emu_attention.cpp).
#include "emu_attention_impl.h"
