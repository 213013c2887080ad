# SPDX-License-Identifier: GPL-2.0
#
# Build the gdirect kernel module, kernel/gdirect.ko.
#
#   make                      against the cached test kernel (scripts/kernel builds it)
#   make KDIR=/lib/modules/$(uname -r)/build
#                             against any kernel tree built with CONFIG_RUST, using that
#                             tree's compilers (pass LLVM=, RUSTC=, BINDGEN= as it was built)
#   make clean
#
# The module must be built by the same rustc as the kernel it is loaded into.

ifeq ($(KDIR),)
KDIR := $(shell $(CURDIR)/scripts/kernel --print-dir)
# The cached test kernel is built with these (scripts/common.sh).
LLVM ?= -19
RUSTC ?= /usr/bin/rustc
BINDGEN ?= $(HOME)/.cargo/bin/bindgen
TEST_KERNEL := 1
endif

KMAKE = $(MAKE) -C $(KDIR) M=$(CURDIR) \
	$(if $(LLVM),LLVM=$(LLVM)) $(if $(RUSTC),RUSTC=$(RUSTC)) $(if $(BINDGEN),BINDGEN=$(BINDGEN))

.PHONY: all modules clean kernel

all: modules

modules: $(if $(TEST_KERNEL),kernel)
	$(KMAKE) modules

# Build (or find in the cache) the test kernel the module is built against.
kernel:
	$(CURDIR)/scripts/kernel

# Kbuild's clean deletes every object file below M, cargo's target/ included: confine it.
clean:
	$(MAKE) -C $(KDIR) M=$(CURDIR)/kernel clean
	rm -f Module.symvers modules.order .Module.symvers.cmd .modules.order.cmd
