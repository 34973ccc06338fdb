# tests/cuemu/cu2cpp.cmake — translates a kernel file (worker/cuda/k_*.cu) into C++ for cuemu:
#   cmake -DIN=k_x.cu -DOUT=k_x.cpp -P cu2cpp.cmake
# `kernel<<<grid, block[, smem[, stream]]>>>(args)` becomes
# `::hp_emu::launcher("kernel", grid, block[, smem[, stream]]).run(kernel, args)` and
# `extern __shared__ T name[];` becomes `T *name = (T *)::hp_emu::dyn_smem();`. Everything else
# is the file as written (cuemu_device.h supplies the device built-ins); #line keeps compiler
# messages pointing at the .cu file.
file(READ "${IN}" src)
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*(<[^<>;(){}]*>)?)[ \t\r\n]*<<<([^>]*)>>>\\(\\)"
       "::hp_emu::launcher(\"\\1\", \\3).run(\\1)" src "${src}")
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_]*(<[^<>;(){}]*>)?)[ \t\r\n]*<<<([^>]*)>>>\\("
       "::hp_emu::launcher(\"\\1\", \\3).run(\\1, " src "${src}")
string(REGEX REPLACE "extern __shared__ ([A-Za-z_0-9 ]*[A-Za-z_0-9]) ([A-Za-z_][A-Za-z_0-9]*)\\[\\];"
       "\\1 *\\2 = (\\1 *)::hp_emu::dyn_smem();" src "${src}")
if(src MATCHES "<<<|extern __shared__")
    message(FATAL_ERROR "cu2cpp: ${IN} has a launch or shared declaration it cannot translate")
endif()
file(WRITE "${OUT}.tmp" "#line 1 \"${IN}\"\n${src}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
