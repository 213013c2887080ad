// SPDX-License-Identifier: GPL-2.0
/*
 * One-line wrappers of C inline functions and macros that Rust cannot call.
 * No logic lives here: it is all in the Rust files. Pointer arguments that
 * Rust passes as void * are the types named in each comment.
 */
#include <linux/dma-mapping.h>
#include <linux/mm.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>

struct pci_dev *gdirect_pci_upstream_bridge(struct pci_dev *dev);
struct pci_dev *gdirect_pci_upstream_bridge(struct pci_dev *dev)
{
	return pci_upstream_bridge(dev);
}

/* dev: struct device * */
int gdirect_dma_mapping_error(void *dev, dma_addr_t addr);
int gdirect_dma_mapping_error(void *dev, dma_addr_t addr)
{
	return dma_mapping_error(dev, addr);
}

bool gdirect_is_pci_p2pdma_page(const struct page *page);
bool gdirect_is_pci_p2pdma_page(const struct page *page)
{
	return is_pci_p2pdma_page(page);
}

phys_addr_t gdirect_page_to_phys(struct page *page);
phys_addr_t gdirect_page_to_phys(struct page *page)
{
	return page_to_phys(page);
}

/* bus: struct pci_bus * */
int gdirect_pci_domain_nr(void *bus);
int gdirect_pci_domain_nr(void *bus)
{
	return pci_domain_nr(bus);
}
