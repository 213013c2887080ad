// SPDX-License-Identifier: GPL-2.0
/*
 * Exports of gdirect_egpu: the NVIDIA nv-p2p functions, implemented in
 * egpu_main.rs, exported as the open nvidia.ko exports them: same names,
 * EXPORT_SYMBOL_GPL (NV_EXPORT_SYMBOL), which __symbol_get() requires, and the
 * wrapper of one C inline function. No logic lives here, and nothing of
 * gdirect's module is compiled in (tests/egpu/independent.sh).
 */
#include <linux/dma-mapping.h>
#include <linux/export.h>
#include <linux/types.h>

struct pci_dev;
struct nvidia_p2p_page_table;
struct nvidia_p2p_dma_mapping;

int nvidia_p2p_get_pages(u64 p2p_token, u32 va_space, u64 virtual_address,
			 u64 length, struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data);
int nvidia_p2p_get_pages_persistent(u64 virtual_address, u64 length,
				    struct nvidia_p2p_page_table **page_table,
				    u32 flags);
int nvidia_p2p_put_pages(u64 p2p_token, u32 va_space, u64 virtual_address,
			 struct nvidia_p2p_page_table *page_table);
int nvidia_p2p_put_pages_persistent(u64 virtual_address,
				    struct nvidia_p2p_page_table *page_table,
				    u32 flags);
int nvidia_p2p_dma_map_pages(struct pci_dev *peer,
			     struct nvidia_p2p_page_table *page_table,
			     struct nvidia_p2p_dma_mapping **dma_mapping);
int nvidia_p2p_dma_unmap_pages(struct pci_dev *peer,
			       struct nvidia_p2p_page_table *page_table,
			       struct nvidia_p2p_dma_mapping *dma_mapping);
int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table);
int nvidia_p2p_free_dma_mapping(struct nvidia_p2p_dma_mapping *dma_mapping);

EXPORT_SYMBOL_GPL(nvidia_p2p_get_pages);
EXPORT_SYMBOL_GPL(nvidia_p2p_get_pages_persistent);
EXPORT_SYMBOL_GPL(nvidia_p2p_put_pages);
EXPORT_SYMBOL_GPL(nvidia_p2p_put_pages_persistent);
EXPORT_SYMBOL_GPL(nvidia_p2p_dma_map_pages);
EXPORT_SYMBOL_GPL(nvidia_p2p_dma_unmap_pages);
EXPORT_SYMBOL_GPL(nvidia_p2p_free_page_table);
EXPORT_SYMBOL_GPL(nvidia_p2p_free_dma_mapping);

/* dma_mapping_error() is inline: the one wrapper the emulator needs. */
int egpu_dma_mapping_error(struct device *dev, dma_addr_t addr);
int egpu_dma_mapping_error(struct device *dev, dma_addr_t addr)
{
	return dma_mapping_error(dev, addr);
}
