// SPDX-License-Identifier: GPL-2.0
/*
 * What gdirect's module (kernel/nv_p2p.rs, kernel/provider/nvidia.rs) takes from NVIDIA's
 * nv-p2p.h, as C static assertions: scripts/build-for-running-kernel compiles this file with
 * the node's installed NVIDIA header included first, so that a driver whose header no longer
 * matches stops the build with the field named ("gdirect: ...") instead of building a module
 * that would read the wrong bytes. Each number here is one kernel/nv_p2p.rs asserts for its
 * own structs.
 */
#include <stddef.h>

#define GD_FACT(cond, what) _Static_assert(cond, "gdirect: " what)
#define GD_MAJOR (NVIDIA_P2P_PAGE_TABLE_VERSION >> 16)
#define GD_MINOR (NVIDIA_P2P_PAGE_TABLE_VERSION & 0xffff)

GD_FACT((GD_MAJOR == 1 && GD_MINOR >= 2) || GD_MAJOR == 2,
	"NVIDIA_P2P_PAGE_TABLE_VERSION is neither 1.2 or later of major 1 nor of major 2");
GD_FACT(offsetof(struct nvidia_p2p_page_table, version) == 0, "nvidia_p2p_page_table.version at offset 0");
GD_FACT(offsetof(struct nvidia_p2p_page_table, page_size) == 4, "nvidia_p2p_page_table.page_size at offset 4");
GD_FACT(offsetof(struct nvidia_p2p_page_table, pages) == 8, "nvidia_p2p_page_table.pages at offset 8");
GD_FACT(offsetof(struct nvidia_p2p_page_table, entries) == 16, "nvidia_p2p_page_table.entries at offset 16");
GD_FACT(offsetof(struct nvidia_p2p_page_table, gpu_uuid) == 24, "nvidia_p2p_page_table.gpu_uuid at offset 24");
#if GD_MAJOR == 2
GD_FACT(offsetof(struct nvidia_p2p_page_table, flags) == 32, "nvidia_p2p_page_table.flags at offset 32");
GD_FACT(NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE == 1, "NVIDIA_P2P_PAGE_TABLE_FLAGS_CPU_CACHEABLE is 1");
#endif
GD_FACT(offsetof(struct nvidia_p2p_page, physical_address) == 0, "nvidia_p2p_page.physical_address at offset 0");
GD_FACT(NVIDIA_P2P_PAGE_SIZE_4KB == 0 && NVIDIA_P2P_PAGE_SIZE_64KB == 1 && NVIDIA_P2P_PAGE_SIZE_128KB == 2,
	"enum nvidia_p2p_page_size_type is 4KB = 0, 64KB = 1, 128KB = 2");

/* The functions the module calls, with the signatures it calls them by (GCC and clang). */
#define GD_SIGNATURE(fn, type) GD_FACT(__builtin_types_compatible_p(__typeof__(&fn), type), #fn " has the signature " #type)
GD_SIGNATURE(nvidia_p2p_get_pages, int (*)(uint64_t, uint32_t, uint64_t, uint64_t, struct nvidia_p2p_page_table **,
					    void (*)(void *), void *));
GD_SIGNATURE(nvidia_p2p_get_pages_persistent, int (*)(uint64_t, uint64_t, struct nvidia_p2p_page_table **, uint32_t));
GD_SIGNATURE(nvidia_p2p_put_pages, int (*)(uint64_t, uint32_t, uint64_t, struct nvidia_p2p_page_table *));
GD_SIGNATURE(nvidia_p2p_put_pages_persistent, int (*)(uint64_t, struct nvidia_p2p_page_table *, uint32_t));
GD_SIGNATURE(nvidia_p2p_free_page_table, int (*)(struct nvidia_p2p_page_table *));
