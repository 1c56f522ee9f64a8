// Built into libsumma only in an AddressSanitizer / LeakSanitizer build
// (SUMMA_SANITIZE containing address or leak; CMakeLists.txt): never in a
// release library.
//
// OpenMPI loads its components (mca_*.so) with dlopen and unloads them with
// dlclose in MPI_Finalize, before LeakSanitizer reports at exit. The process-
// lifetime allocations those components keep are then attributed to
// "<unknown module>", which no suppression can name (tests/lsan.supp lists
// the MPI stack's libraries), unless every malloc records its whole stack
// with the slow unwinder (fast_unwind_on_malloc=0), which made the sanitized
// tests about 60 % slower (44.5 s against 27.6 s on schemes_np4 + comm_np4).
// Keeping unloaded modules mapped costs nothing in a short-lived checked
// process and leaves every leak in summa's own code reported as before.
// ASan's own dlclose interceptor forwards to the next definition after
// libasan in the lookup order (RTLD_NEXT): this one, in any executable that
// links libsumma before libc.
extern "C" __attribute__((visibility("default"))) int dlclose(void* handle);

extern "C" __attribute__((visibility("default"))) int dlclose(void* /*handle*/) {
  return 0;
}
