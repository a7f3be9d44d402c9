// Opens an exported kernel library from C++ through TVM-FFI and looks up functions by name:
//   load_artifact DIR/kernels.so llmcompile_n4096 [...]
// (tests/test_export.py builds and runs it; a real caller then invokes the function with
// DLTensors, as the manifest's tensors list them.)
#include <tvm/ffi/extra/module.h>

#include <iostream>

int main(int argc, char** argv) {
  tvm::ffi::Module mod = tvm::ffi::Module::LoadFromFile(argv[1]);
  for (int i = 2; i < argc; ++i) {
    std::cout << argv[i] << (mod->GetFunction(argv[i]).has_value() ? " found" : " missing") << std::endl;
  }
  return 0;
}
