// jemalloc's settings for the programs that run the passes (those linked with onnxopt_malloc). The
// library reads this symbol when it starts; MALLOC_CONF in the environment is applied after it.
//
// thp:always: jemalloc asks the kernel for transparent huge pages (madvise) for its heap. A pipeline
// fills its whole peak with fresh memory once: at 100k nodes that was 91k page faults of 4 KiB, each a
// trip into the kernel, against 5-6k with huge pages. The large-model benchmark's 100k-node process
// went from 1.85-2.03 s to 1.61-1.82 s side by side, for about 10% more peak memory (360 -> 395 MB).
// Where the kernel's THP mode is "never" this asks for nothing; MALLOC_CONF=thp:default turns it off.
extern "C" {
const char* malloc_conf = "thp:always,metadata_thp:auto";
}
