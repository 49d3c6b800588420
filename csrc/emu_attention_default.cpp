// The FIA emulation kernel, portable vector path (see emu_attention_impl.h).
#include "emu_attention_impl.h"
