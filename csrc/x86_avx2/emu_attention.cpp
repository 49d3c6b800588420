// The FIA emulation kernel, AVX2 + FMA + F16C path (built with -mavx2 -mfma -mf16c on
// x86-64 only; chosen at run time when the CPU has them, see ../emu_attention.cpp).
//
// Why a folder of its own: setuptools links objects in sorted source order, and the linker
// keeps the first copy of an inline function that several objects emit. "csrc/x86_avx2/"
// sorts after every other source, so this object comes last and its copies of shared
// inline code (compiled with AVX2 enabled) are never the ones kept for the portable code.
#include "../emu_attention_impl.h"
