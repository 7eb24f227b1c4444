// gperftools sampled heap profile (MallocExtension::GetHeapSample, the
// "heap_v2/<period>" format; sampling needs TCMALLOC_SAMPLE_PARAMETER) of
// allocations made by allocdiag_sym_sampled_site, written to argv[1].
// Linked with -ltcmalloc: GetHeapSample is a C++ method with no C shim.
#include <gperftools/malloc_extension.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

static void *blocks[4096];

__attribute__((noinline)) void allocdiag_sym_sampled_site(int n, std::size_t size) {
    for (int i = 0; i < n; i++) {
        blocks[i] = std::malloc(size);
        std::memset(blocks[i], 1, size);
    }
}

int main(int argc, char **argv) {
    allocdiag_sym_sampled_site(argc > 2 ? std::atoi(argv[2]) : 2000, 8192);
    std::string text;
    MallocExtension::instance()->GetHeapSample(&text);
    FILE *f = std::fopen(argc > 1 ? argv[1] : "/dev/stdout", "w");
    if (!f)
        return 1;
    std::fputs(text.c_str(), f);
    std::fclose(f);
    std::printf("READY %zu\n", text.size());
    return 0;
}
