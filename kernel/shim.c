// SPDX-License-Identifier: GPL-2.0
/*
 * One-line wrappers of C inline functions and macros that Rust cannot call,
 * and the layout facts (offsetof, sizeof) that layout.rs checks.
 * No logic lives here: it is all in the Rust files. Pointer arguments that
 * Rust passes as void * are the types named in each comment.
 */
#include <linux/blkdev.h>
#include <linux/cgroup.h>
#include <linux/cred.h>
#include <linux/dma-mapping.h>
#include <linux/fileattr.h>
#include <linux/fs.h>
#include <linux/fsnotify.h>
#include <linux/iversion.h>
#include <linux/kthread.h>
#include <linux/memcontrol.h>
#include <linux/miscdevice.h>
#include <linux/mm.h>
#include <linux/netdevice.h>
#include <linux/pci.h>
#include <linux/pci-p2pdma.h>
#include <linux/sched/mm.h>
#include <linux/sched/signal.h>
#include <linux/sched/user.h>
#include <linux/user_namespace.h>
#include <linux/workqueue.h>
#include <net/route.h>

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

/* kiocb: struct kiocb *, file: struct file * */
void gdirect_init_sync_kiocb(void *kiocb, void *file);
void gdirect_init_sync_kiocb(void *kiocb, void *file)
{
	init_sync_kiocb(kiocb, file);
}

/* file_start_write() and file_end_write() are inline; file: struct file * */
void gdirect_file_start_write(void *file);
void gdirect_file_start_write(void *file)
{
	file_start_write(file);
}

void gdirect_file_end_write(void *file);
void gdirect_file_end_write(void *file)
{
	file_end_write(file);
}

bool gdirect_file_start_write_trylock(void *file);
bool gdirect_file_start_write_trylock(void *file)
{
	return file_start_write_trylock(file);
}

/*
 * inode_trylock_shared(), inode_lock_shared_killable() and inode_unlock_shared()
 * are inline; file: struct file *, whose inode's lock they take
 */
bool gdirect_file_inode_trylock_shared(void *file);
bool gdirect_file_inode_trylock_shared(void *file)
{
	return inode_trylock_shared(file_inode(file));
}

int gdirect_file_inode_lock_shared_killable(void *file);
int gdirect_file_inode_lock_shared_killable(void *file)
{
	return inode_lock_shared_killable(file_inode(file));
}

void gdirect_file_inode_unlock_shared(void *file);
void gdirect_file_inode_unlock_shared(void *file)
{
	inode_unlock_shared(file_inode(file));
}

/* FMODE_NOWAIT is a macro; file: struct file * */
bool gdirect_file_nowait(void *file);
bool gdirect_file_nowait(void *file)
{
	return ((struct file *)file)->f_mode & FMODE_NOWAIT;
}

/* fsnotify_access() and fsnotify_modify() are inline; file: struct file * */
void gdirect_fsnotify_access(void *file);
void gdirect_fsnotify_access(void *file)
{
	fsnotify_access(file);
}

void gdirect_fsnotify_modify(void *file);
void gdirect_fsnotify_modify(void *file)
{
	fsnotify_modify(file);
}

/* inode_get_mtime() and inode_get_ctime() of file_inode() are inline; file: struct file * */
struct timespec64 gdirect_file_mtime(void *file);
struct timespec64 gdirect_file_mtime(void *file)
{
	return inode_get_mtime(file_inode(file));
}

struct timespec64 gdirect_file_ctime(void *file);
struct timespec64 gdirect_file_ctime(void *file)
{
	return inode_get_ctime(file_inode(file));
}

/*
 * Whether the file's times are never updated by a write: IS_NOCMTIME() and
 * FMODE_NOCMTIME, as file_update_time_flags() tests them; file: struct file *
 */
bool gdirect_file_nocmtime(void *file);
bool gdirect_file_nocmtime(void *file)
{
	return IS_NOCMTIME(file_inode(file)) ||
	       (((struct file *)file)->f_mode & FMODE_NOCMTIME);
}

/*
 * need_cmtime_update()'s i_version part: IS_I_VERSION() is a macro and
 * inode_iversion_need_inc() inline; file: struct file *
 */
bool gdirect_file_iversion_need_inc(void *file);
bool gdirect_file_iversion_need_inc(void *file)
{
	return IS_I_VERSION(file_inode(file)) &&
	       inode_iversion_need_inc(file_inode(file));
}

/* pinned_vm of an mm: atomic64_add_return() is inline. */
/* mm: struct mm_struct * */
s64 gdirect_mm_pinned_add(void *mm, s64 pages);
s64 gdirect_mm_pinned_add(void *mm, s64 pages)
{
	return atomic64_add_return(pages, &((struct mm_struct *)mm)->pinned_vm);
}

/*
 * current->mm (`current` is an inline). Not read from Rust: the Rust bindings
 * of a kernel built without CONFIG_SCHEDSTATS (the rig's) misplace every
 * task_struct field from `stats` on by 48 bytes (mm at 864, not 912), so the
 * kernel crate's CurrentTask::mm() reads pushable_tasks.prio_list.prev, and
 * Task::pid() and group_leader() read other fields too. The cause is bindgen
 * (0.73, and upstream): the empty `struct sched_statistics {}
 * ____cacheline_aligned` gets no #[repr(align(64))] (a zero-sized struct never
 * gets an explicit alignment), so Rust lays it out at 720 where C puts it at
 * 768. It is no option the module can count on being set (distribution
 * kernels have SCHEDSTATS=y, where the struct is not empty and the layout
 * right), so the module reads no task_struct field from Rust: only through C
 * (this helper) or the kernel's functions (task_uid, task_tgid_nr_ns, ...).
 */
void *gdirect_current_mm(void);
void *gdirect_current_mm(void)
{
	return current->mm;
}

/* fatal_signal_pending() and current are inline. */
bool gdirect_fatal_signal_pending(void);
bool gdirect_fatal_signal_pending(void)
{
	return fatal_signal_pending(current);
}

/* get_current_user() is a macro; the result is a struct user_struct *. */
void *gdirect_get_current_user(void);
void *gdirect_get_current_user(void)
{
	return get_current_user();
}

/* locked_vm of a user: atomic_long_read() and atomic_long_try_cmpxchg() are inline. */
/* user: struct user_struct * */
long gdirect_user_locked_vm(void *user);
long gdirect_user_locked_vm(void *user)
{
	return atomic_long_read(&((struct user_struct *)user)->locked_vm);
}

/* user: struct user_struct * */
bool gdirect_user_locked_vm_try_cmpxchg(void *user, long *old, long new);
bool gdirect_user_locked_vm_try_cmpxchg(void *user, long *old, long new)
{
	return atomic_long_try_cmpxchg(&((struct user_struct *)user)->locked_vm, old, new);
}

/* current_user_ns() is inline; the result is a struct user_namespace *. */
void *gdirect_current_user_ns(void);
void *gdirect_current_user_ns(void)
{
	return current_user_ns();
}

/*
 * The parent and the owner (its uid in the initial namespace) of a user
 * namespace: fields, read in C for the reason gdirect_current_mm gives.
 * ns: struct user_namespace *
 */
void *gdirect_user_ns_parent(void *ns);
void *gdirect_user_ns_parent(void *ns)
{
	return ((struct user_namespace *)ns)->parent;
}

/* ns: struct user_namespace * */
u32 gdirect_user_ns_owner(void *ns);
u32 gdirect_user_ns_owner(void *ns)
{
	return from_kuid(&init_user_ns, ((struct user_namespace *)ns)->owner);
}

/* The namespace's inode number (/proc/PID/ns/user); ns: struct user_namespace * */
u32 gdirect_user_ns_inum(void *ns);
u32 gdirect_user_ns_inum(void *ns)
{
	return ((struct user_namespace *)ns)->ns.inum;
}

/* rlimit() is inline. */
u64 gdirect_memlock_limit_pages(void);
u64 gdirect_memlock_limit_pages(void)
{
	return rlimit(RLIMIT_MEMLOCK) >> PAGE_SHIFT;
}

/* disk: struct gendisk * */
u64 gdirect_get_capacity(void *disk);
u64 gdirect_get_capacity(void *disk)
{
	return get_capacity((struct gendisk *)disk);
}

/*
 * vfs_fileattr_get()'s FS_XFLAG_* for a file (struct file_kattr is not in the
 * bindings), or its negative errno. file: struct file *
 */
s64 gdirect_fileattr_xflags(void *file);
s64 gdirect_fileattr_xflags(void *file)
{
	struct file_kattr fa = { .fsx_valid = true };
	int err = vfs_fileattr_get(file_dentry((struct file *)file), &fa);

	return err ? err : fa.fsx_xflags;
}

/* q: struct request_queue * */
bool gdirect_blk_queue_pci_p2pdma(void *q);
bool gdirect_blk_queue_pci_p2pdma(void *q)
{
	return blk_queue_pci_p2pdma((struct request_queue *)q);
}

int gdirect_pfn_valid(unsigned long pfn);
int gdirect_pfn_valid(unsigned long pfn)
{
	return pfn_valid(pfn);
}

struct page *gdirect_pfn_to_page(unsigned long pfn);
struct page *gdirect_pfn_to_page(unsigned long pfn)
{
	return pfn_to_page(pfn);
}

void *gdirect_page_address(struct page *page);
void *gdirect_page_address(struct page *page)
{
	return page_address(page);
}

struct workqueue_struct *gdirect_alloc_workqueue(const char *name, unsigned int flags,
						int max_active);
struct workqueue_struct *gdirect_alloc_workqueue(const char *name, unsigned int flags,
						int max_active)
{
	return alloc_workqueue("%s", flags, max_active, name);
}

/* dev: struct device */
int gdirect_device_lock_interruptible(void *dev);
int gdirect_device_lock_interruptible(void *dev)
{
	return device_lock_interruptible(dev);
}

/* dev: struct device */
void gdirect_device_unlock(void *dev);
void gdirect_device_unlock(void *dev)
{
	device_unlock(dev);
}

/*
 * The identity a batch's transfers run under (submitter.rs): the calls below
 * are inline functions or macros, or (for the cgroup ones) inline stubs when
 * the kernel is built without the controller.
 */

/* current_cred() is a macro; no reference is taken. Returns const struct cred * */
const void *gdirect_current_cred(void);
const void *gdirect_current_cred(void)
{
	return current_cred();
}

/* cred: const struct cred *; returns the one it replaces */
const void *gdirect_override_creds(const void *cred);
const void *gdirect_override_creds(const void *cred)
{
	return override_creds(cred);
}

/* cred: const struct cred *, as override_creds() returned it */
const void *gdirect_revert_creds(const void *cred);
const void *gdirect_revert_creds(const void *cred)
{
	return revert_creds(cred);
}

/* rlimit() is inline. */
u64 gdirect_fsize_limit(void);
u64 gdirect_fsize_limit(void)
{
	return rlimit(RLIMIT_FSIZE);
}

/* The caller's io (blkcg) css, referenced; NULL without CONFIG_BLK_CGROUP. */
void *gdirect_current_blkcg_css(void);
void *gdirect_current_blkcg_css(void)
{
#ifdef CONFIG_BLK_CGROUP
	return task_get_css(current, io_cgrp_id);
#else
	return NULL;
#endif
}

/* css: struct cgroup_subsys_state * */
void gdirect_css_put(void *css);
void gdirect_css_put(void *css)
{
	css_put(css);
}

/* css: struct cgroup_subsys_state * or NULL; inline without CONFIG_BLK_CGROUP */
void gdirect_kthread_associate_blkcg(void *css);
void gdirect_kthread_associate_blkcg(void *css)
{
	kthread_associate_blkcg(css);
}

/*
 * The caller's memory cgroup, referenced (an inline returning NULL without
 * CONFIG_MEMCG); with no mm it takes current's (root for a kernel thread).
 */
void *gdirect_current_memcg(void);
void *gdirect_current_memcg(void)
{
	return get_mem_cgroup_from_mm(NULL);
}

/* memcg: struct mem_cgroup * or NULL; returns the one it replaces */
void *gdirect_set_active_memcg(void *memcg);
void *gdirect_set_active_memcg(void *memcg)
{
	return set_active_memcg(memcg);
}

/* memcg: struct mem_cgroup * or NULL */
void gdirect_mem_cgroup_put(void *memcg);
void gdirect_mem_cgroup_put(void *memcg)
{
	mem_cgroup_put(memcg);
}

/* fabric.rs: the route to an IPv4 address (__be32), in the initial namespace. */
struct rtable *gdirect_ip_route_output(__be32 daddr);
struct rtable *gdirect_ip_route_output(__be32 daddr)
{
	return ip_route_output(&init_net, daddr, 0, 0, 0, RT_SCOPE_UNIVERSE);
}

/* Under rcu_read_lock(). */
struct net_device *gdirect_rt_dev_rcu(struct rtable *rt);
struct net_device *gdirect_rt_dev_rcu(struct rtable *rt)
{
	return dst_dev_rcu(&rt->dst);
}

void gdirect_ip_rt_put(struct rtable *rt);
void gdirect_ip_rt_put(struct rtable *rt)
{
	ip_rt_put(rt);
}

void gdirect_dev_hold(struct net_device *dev);
void gdirect_dev_hold(struct net_device *dev)
{
	dev_hold(dev);
}

/* struct net_device is opaque to bindgen: the field fabric.rs reads. */
struct device *gdirect_netdev_parent(const struct net_device *dev);
struct device *gdirect_netdev_parent(const struct net_device *dev)
{
	return dev->dev.parent;
}

void gdirect_dev_put(struct net_device *dev);
void gdirect_dev_put(struct net_device *dev)
{
	dev_put(dev);
}

/*
 * Layout facts for layout.rs: the offset C gives each field of a kernel structure that the
 * Rust code reads or writes through bindgen's definitions, the size of each structure it
 * builds or zeroes itself, and the values of the macros it restates (bindgen cannot evaluate
 * their casts). Only C knows them (offsetof, sizeof); the comparison is in Rust.
 */
struct gdirect_layout {
	const char *name;
	size_t value;
};
#define GD_OFF(type, field) { #type "." #field, offsetof(struct type, field) }
#define GD_SIZE(type) { "sizeof " #type, sizeof(struct type) }
#define GD_VALUE(name) { #name, (__force size_t)(name) }
static const struct gdirect_layout gdirect_layout_facts[] = {
	GD_OFF(file, f_inode),
	GD_OFF(file, f_op),
	GD_OFF(file, f_mode),
	GD_VALUE(FMODE_READ),
	GD_VALUE(FMODE_WRITE),
	GD_VALUE(FMODE_CAN_READ),
	GD_VALUE(FMODE_CAN_WRITE),
	GD_OFF(file_operations, read_iter),
	GD_OFF(file_operations, write_iter),
	GD_OFF(file, f_mapping),
	GD_OFF(address_space, host),
	GD_OFF(inode, i_sb),
	GD_OFF(inode, i_mode),
	GD_OFF(inode, i_flags),
	GD_OFF(super_block, s_bdev),
	GD_OFF(super_block, s_type),
	GD_OFF(file_system_type, name),
	GD_OFF(block_device, bd_disk),
	GD_OFF(block_device, bd_device),
	GD_OFF(gendisk, part0),
	GD_OFF(gendisk, queue),
	GD_OFF(gendisk, diskseq),
	GD_OFF(gendisk, flags),
	GD_OFF(request_queue, limits.logical_block_size),
	GD_OFF(device, parent),
	GD_OFF(device, class),
	GD_OFF(device, kobj),
	GD_OFF(device, type),
	GD_OFF(device, bus),
	GD_OFF(device, groups),
	GD_OFF(device, driver),
	GD_OFF(kobject, name),
	GD_OFF(kobject, sd),
	GD_OFF(class, name),
	GD_OFF(attribute, name),
	GD_OFF(device_attribute, attr),
	GD_OFF(device_attribute, show),
	GD_OFF(attribute_group, is_visible),
	GD_OFF(attribute_group, attrs),
	GD_OFF(device_driver, name),
	GD_OFF(pci_driver, driver),
	GD_OFF(pci_driver, driver_managed_dma),
	GD_OFF(pci_dev, bus),
	GD_OFF(pci_dev, devfn),
	GD_OFF(pci_dev, resource),
	GD_OFF(pci_dev, dev),
	GD_OFF(pci_dev, acs_cap),
	GD_OFF(pci_bus, number),
	GD_OFF(resource, start),
	GD_OFF(resource, end),
	GD_OFF(resource, flags),
	GD_SIZE(resource),
	GD_OFF(pci_bus_region, start),
	GD_SIZE(pci_bus_region),
	GD_OFF(bio_vec, bv_page),
	GD_OFF(bio_vec, bv_len),
	GD_OFF(bio_vec, bv_offset),
	GD_SIZE(bio_vec),
	GD_OFF(kiocb, ki_pos),
	GD_OFF(kiocb, ki_flags),
	GD_SIZE(kiocb),
	GD_SIZE(iov_iter),
	GD_OFF(notifier_block, notifier_call),
	GD_OFF(notifier_block, next),
	GD_OFF(notifier_block, priority),
	GD_SIZE(notifier_block),
	GD_OFF(miscdevice, fops),
	GD_OFF(miscdevice, mode),
	GD_OFF(file_operations, owner),
};

const struct gdirect_layout *gdirect_layouts(size_t *len);
const struct gdirect_layout *gdirect_layouts(size_t *len)
{
	*len = ARRAY_SIZE(gdirect_layout_facts);
	return gdirect_layout_facts;
}

/* The task's exec count (t: struct task_struct *): read as exec writes it (WRITE_ONCE). */
u64 gdirect_task_exec_id(void *t);
u64 gdirect_task_exec_id(void *t)
{
	return READ_ONCE(((struct task_struct *)t)->self_exec_id);
}

/* dev: struct device * */
int gdirect_device_is_registered(void *dev);
int gdirect_device_is_registered(void *dev)
{
	return device_is_registered(dev);
}
