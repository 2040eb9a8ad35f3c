/* A host program that knows nothing of strata: it loads a plugin built against the
 * installed strata C++ libraries (optimizer_consumer.cpp as a shared module) with dlopen and
 * calls its strata_consumer_train(DIR). Usage: strata_plugin_host PLUGIN.so DIR */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char** argv) {
  void* lib;
  int (*train)(const char*);
  int rc;
  if (argc != 3) {
    printf("usage: %s PLUGIN DIR\n", argv[0]);
    return 2;
  }
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    printf("dlopen %s: %s\n", argv[1], dlerror());
    return 1;
  }
  *(void**)(&train) = dlsym(lib, "strata_consumer_train");
  if (train == NULL) {
    printf("dlsym strata_consumer_train: %s\n", dlerror());
    return 1;
  }
  rc = train(argv[2]);
  if (rc == 0) printf("plugin consumer ok\n");
  dlclose(lib);
  return rc;
}
