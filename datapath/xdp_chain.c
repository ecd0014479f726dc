// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * The loaders' side of the XDP chain (xdp_chain.h, datapath/README.md
 * "Chaining"): one dispatcher per node instance, attached to every device
 * that runs a segscope XDP program; each member sits in its device's row of
 * the shared prog array, at its role's column. Linked into every XDP loader
 * (altmark_rx, ioam_rx, stamp_collector, stamp_reflector).
 *
 * Loaders of one instance are serialised by an flock on
 * XDP_CHAIN_LOCK_DIR/<instance dir, '/' -> '_'>.lock, held from
 * xdp_chain_open() to xdp_chain_close(): check-then-update of a slot, the
 * creation and the removal of the pins are never interleaved with another
 * loader's. (Two instance paths that map to one lock file only wait for each
 * other needlessly.)
 *
 * Join and leave are ordered so that no packet misses a member that stays:
 * a member's slot is filled before the dispatcher is attached to a new
 * device, and the dispatcher leaves a device before its last slot and its
 * device slot are emptied.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/if_link.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "loader_util.h"
#include "xdp_chain.h"
#include "xdp_chain.skel.h"

#define DISPATCHER_PIN PROG_PIN_NAME   /* <instance>/xdp_chain/prog */

static void chain_init(struct xdp_chain *c)
{
	memset(c, 0, sizeof(*c));
	c->lock_fd = c->progs_fd = c->devs_fd = c->prog_fd = -1;
}

static int lock_instance(struct xdp_chain *c)
{
	char path[PATH_MAX], name[PATH_MAX];
	size_t i, n = 0;
	int err;

	for (i = 0; c->instance_dir[i] && n + 1 < sizeof(name); i++) {
		if (c->instance_dir[i] == '/' && n == 0)
			continue;   /* no leading '_' */
		name[n++] = c->instance_dir[i] == '/' ? '_' : c->instance_dir[i];
	}
	name[n] = '\0';
	err = mkdir_p(XDP_CHAIN_LOCK_DIR);
	if (err) {
		die_msg("cannot create %s: %s", XDP_CHAIN_LOCK_DIR, strerror(-err));
		return err;
	}
	if (snprintf(path, sizeof(path), "%s/%s.lock", XDP_CHAIN_LOCK_DIR, name) >= (int)sizeof(path))
		return -ENAMETOOLONG;
	c->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (c->lock_fd < 0 || flock(c->lock_fd, LOCK_EX)) {
		err = -errno;
		die_msg("cannot lock %s: %s", path, strerror(errno));
		return err;
	}
	return 0;
}

static int pin_path(const struct xdp_chain *c, const char *name, char *out, size_t len)
{
	return snprintf(out, len, "%s/%s", c->dir, name) >= (int)len ? -ENAMETOOLONG : 0;
}

/* Open the three pins; 1 all there, 0 none there, <0 some missing or unreadable (said). */
static int open_pins(struct xdp_chain *c)
{
	static const char *const names[] = { XDP_CHAIN_PROGS_MAP, XDP_CHAIN_DEVS_MAP, DISPATCHER_PIN };
	int *fds[] = { &c->progs_fd, &c->devs_fd, &c->prog_fd };
	char path[PATH_MAX];
	int found = 0;

	for (int i = 0; i < 3; i++) {
		if (pin_path(c, names[i], path, sizeof(path)))
			return -ENAMETOOLONG;
		*fds[i] = bpf_obj_get(path);
		if (*fds[i] >= 0)
			found++;
		else if (errno != ENOENT)
			die_msg("cannot open %s: %s", path, strerror(errno));
	}
	if (found == 3) {
		c->prog_id = prog_id_of(c->prog_fd);
		return 1;
	}
	if (found == 0)
		return 0;
	die_msg("the chain in %s is incomplete (a loader interrupted while creating or removing it?): "
		"check that no device runs its dispatcher, then remove the directory", c->dir);
	return -EIO;
}

/* Load the dispatcher with fresh maps and pin all three (nothing pinned on error). */
static int create_pins(struct xdp_chain *c)
{
	struct xdp_chain_bpf *skel;
	char path[PATH_MAX];
	int err;

	err = mkdir_p(c->dir);
	if (err) {
		die_msg("cannot create %s: %s", c->dir, strerror(-err));
		return err;
	}
	skel = xdp_chain_bpf__open_and_load();
	if (!skel) {
		err = -errno;
		die_msg("cannot load the chain dispatcher (verifier log above): %s", strerror(errno));
		return err;
	}
	err = pin_path(c, XDP_CHAIN_PROGS_MAP, path, sizeof(path)) ?: bpf_map__pin(skel->maps.xdp_chain_progs, path);
	if (!err)
		err = pin_path(c, XDP_CHAIN_DEVS_MAP, path, sizeof(path)) ?: bpf_map__pin(skel->maps.xdp_chain_devs, path);
	if (!err)
		err = pin_path(c, DISPATCHER_PIN, path, sizeof(path)) ?: bpf_program__pin(skel->progs.xdp_chain, path);
	if (err)
		die_msg("cannot pin the chain in %s: %s", c->dir, strerror(-err));
	xdp_chain_bpf__destroy(skel);
	if (err) {
		unpin_dir(c->dir);
		return err;
	}
	return open_pins(c) == 1 ? 0 : -EIO;
}

int xdp_chain_open(struct xdp_chain *c, const char *instance_dir, bool create)
{
	int err;

	chain_init(c);
	if (snprintf(c->instance_dir, sizeof(c->instance_dir), "%s", instance_dir) >= (int)sizeof(c->instance_dir) ||
	    snprintf(c->dir, sizeof(c->dir), "%s/%s", instance_dir, XDP_CHAIN_DIR_NAME) >= (int)sizeof(c->dir)) {
		die_msg("--pin-dir: %s is too long", instance_dir);
		return -ENAMETOOLONG;
	}
	err = ensure_bpffs() ?: lock_instance(c);
	if (!err)
		err = open_pins(c);
	if (err == 0 && create)
		err = create_pins(c);
	if (err < 0) {
		xdp_chain_close(c);
		return err;
	}
	return 0;
}

int xdp_chain_reuse_maps(const struct xdp_chain *c, struct bpf_object *obj)
{
	static const char *const names[] = { XDP_CHAIN_PROGS_MAP, XDP_CHAIN_DEVS_MAP };
	const int fds[] = { c->progs_fd, c->devs_fd };

	for (int i = 0; i < 2; i++) {
		struct bpf_map *map = bpf_object__find_map_by_name(obj, names[i]);
		int err;

		if (!map) {
			die_msg("the BPF object has no map %s (not built with xdp_chain.h)", names[i]);
			return -ENOENT;
		}
		err = bpf_map__reuse_fd(map, fds[i]);
		if (err) {
			die_msg("cannot use %s/%s for the program: %s", c->dir, names[i], strerror(-err));
			return err;
		}
	}
	return 0;
}

/* Program id in slot key (0: empty). A prog array answers user space with ids. */
static uint32_t slot_prog(const struct xdp_chain *c, uint32_t key)
{
	uint32_t id = 0;

	if (bpf_map_lookup_elem(c->progs_fd, &key, &id))
		return 0;   /* ENOENT: empty */
	return id;
}

/* "stamp_reflector (program 42)" of a program id, its kernel name when no role fits. */
static const char *prog_label(uint32_t id, int role, char *buf, size_t len)
{
	struct bpf_prog_info info = {};
	uint32_t info_len = sizeof(info);
	int fd = bpf_prog_get_fd_by_id(id);

	if (role >= 0 && role < XDP_CHAIN_NR_ROLES) {
		snprintf(buf, len, "%s (program %u)", xdp_chain_role_names[role], id);
	} else if (fd >= 0 && !bpf_obj_get_info_by_fd(fd, &info, &info_len)) {
		snprintf(buf, len, "program %u (%s)", id, info.name);
	} else {
		snprintf(buf, len, "program %u", id);
	}
	if (fd >= 0)
		close(fd);
	return buf;
}

static int dev_ifindex(const char *netns, const char *dev, uint32_t *ifindex)
{
	int idx;

	if (enter_netns(netns))
		return -ENOENT;
	idx = resolve_ifindex(dev);
	if (idx < 0)
		return idx;
	*ifindex = idx;
	return 0;
}

static int read_devs(const struct xdp_chain *c, struct xdp_chain_dev_table *t)
{
	uint32_t zero = 0;

	memset(t, 0, sizeof(*t));
	if (bpf_map_lookup_elem(c->devs_fd, &zero, t)) {
		int err = -errno;

		die_msg("cannot read %s/%s: %s", c->dir, XDP_CHAIN_DEVS_MAP, strerror(errno));
		return err;
	}
	return 0;
}

/* Device slot `slot` serves ifindex from now on (0: the slot is free again). One field changes
 * per write, so the programs reading the table meanwhile see either value of it, never a mix. */
static int set_dev_slot(const struct xdp_chain *c, uint32_t slot, uint32_t ifindex)
{
	struct xdp_chain_dev_table t;
	uint32_t zero = 0;
	int err = read_devs(c, &t);

	if (err)
		return err;
	t.ifindex[slot] = ifindex;
	if (bpf_map_update_elem(c->devs_fd, &zero, &t, BPF_EXIST)) {
		err = -errno;
		die_msg("cannot write %s/%s: %s", c->dir, XDP_CHAIN_DEVS_MAP, strerror(errno));
	}
	return err;
}

/* The device slot serving ifindex, or -1. */
static int dev_slot(const struct xdp_chain_dev_table *t, uint32_t ifindex)
{
	for (int slot = 0; ifindex && slot < XDP_CHAIN_MAX_DEVS; slot++)
		if (t->ifindex[slot] == ifindex)
			return slot;
	return -1;
}

/* The lowest free device slot (its row emptied), or -ENOSPC. Low slots first: the programs'
 * scan of the table stops at the packet's device. */
static int alloc_dev_slot(const struct xdp_chain *c, const struct xdp_chain_dev_table *t, uint32_t *slot)
{
	for (uint32_t s = 0; s < XDP_CHAIN_MAX_DEVS; s++) {
		if (t->ifindex[s])
			continue;
		/* a row nobody uses is empty; clear what an interrupted leave may have left */
		for (uint32_t role = 0; role < XDP_CHAIN_NR_ROLES; role++) {
			uint32_t key = s * XDP_CHAIN_NR_ROLES + role;

			bpf_map_delete_elem(c->progs_fd, &key);
		}
		*slot = s;
		return 0;
	}
	return -ENOSPC;
}

int xdp_chain_uses_maps(const struct xdp_chain *c, int prog_fd, uint32_t *prog_id)
{
	struct bpf_map_info chain_maps[2] = {}, info;
	struct bpf_prog_info pinfo = {};
	uint32_t len = sizeof(info), map_ids[64], n;
	int fds[2] = { c->progs_fd, c->devs_fd }, rc = 0;

	for (int i = 0; i < 2; i++) {
		len = sizeof(chain_maps[i]);
		if (bpf_obj_get_info_by_fd(fds[i], &chain_maps[i], &len))
			return -errno;
	}
	len = sizeof(pinfo);
	pinfo.nr_map_ids = sizeof(map_ids) / sizeof(map_ids[0]);
	pinfo.map_ids = (uintptr_t)map_ids;
	if (bpf_obj_get_info_by_fd(prog_fd, &pinfo, &len))
		return -errno;
	n = pinfo.nr_map_ids < 64 ? pinfo.nr_map_ids : 64;
	for (uint32_t i = 0; i < n && !rc; i++) {
		int fd = bpf_map_get_fd_by_id(map_ids[i]);

		memset(&info, 0, sizeof(info));
		len = sizeof(info);
		if (fd < 0 || bpf_obj_get_info_by_fd(fd, &info, &len)) {
			if (fd >= 0)
				close(fd);
			continue;
		}
		close(fd);
		for (int j = 0; j < 2; j++)
			if (!strcmp(info.name, chain_maps[j].name) && info.id != chain_maps[j].id)
				rc = -ESTALE;
	}
	if (prog_id)
		*prog_id = pinfo.id;
	return rc;
}

/*
 * The member must use this chain's maps: a member loaded for a chain that was
 * removed since (its last device left) would otherwise look up a device table
 * nobody fills, and pass everything past the members behind it.
 */
static int check_member_maps(const struct xdp_chain *c, int prog_fd)
{
	uint32_t id = 0;
	int rc = xdp_chain_uses_maps(c, prog_fd, &id);

	if (rc == -ESTALE)
		die_msg("program %u uses another %s than the chain in %s (it was loaded for a chain that was "
			"removed when its last device left): detach it and attach it again", id,
			XDP_CHAIN_DEVS_MAP, c->dir);
	return rc;
}

int xdp_chain_join(struct xdp_chain *c, const char *netns, const char *dev, enum xdp_chain_role role, int prog_fd)
{
	uint32_t ifindex, slot, key, attached = 0, held;
	struct xdp_chain_dev_table t;
	bool new_dev = false;
	char label[128];
	int err, found;

	if (c->progs_fd < 0 || (unsigned int)role >= XDP_CHAIN_NR_ROLES)
		return -EINVAL;
	err = dev_ifindex(netns, dev, &ifindex) ?: check_member_maps(c, prog_fd) ?: read_devs(c, &t);
	if (err)
		return err;
	err = bpf_xdp_query_id(ifindex, XDP_FLAGS_DRV_MODE, &attached);
	if (err) {
		die_msg("--dev: cannot query the XDP program of %s: %s", dev, strerror(-err));
		return err;
	}
	if (attached && attached != c->prog_id) {
		die_msg("--dev: %s runs %s, not the XDP chain of %s (dispatcher program %u); detach it first",
			dev, prog_label(attached, -1, label, sizeof(label)), c->instance_dir, c->prog_id);
		return -EBUSY;
	}
	found = dev_slot(&t, ifindex);
	if (found >= 0) {
		slot = found;
	} else {
		if (alloc_dev_slot(c, &t, &slot)) {
			die_msg("--dev: the XDP chain of %s already serves %d devices", c->instance_dir,
				XDP_CHAIN_MAX_DEVS);
			return -ENOSPC;
		}
		new_dev = true;
	}
	key = slot * XDP_CHAIN_NR_ROLES + role;
	held = slot_prog(c, key);
	if (held) {
		die_msg("--dev: %s already runs %s in the XDP chain of %s; detach it first", dev,
			prog_label(held, role, label, sizeof(label)), c->instance_dir);
		return -EEXIST;
	}
	/* the member's slot first: it runs from the dispatcher's first packet on this device */
	if (bpf_map_update_elem(c->progs_fd, &key, &prog_fd, BPF_ANY)) {
		err = -errno;
		die_msg("cannot put the program into %s/%s: %s", c->dir, XDP_CHAIN_PROGS_MAP, strerror(errno));
		return err;
	}
	if (new_dev && (err = set_dev_slot(c, slot, ifindex))) {
		bpf_map_delete_elem(c->progs_fd, &key);
		return err;
	}
	if (!attached) {
		/* UPDATE_IF_NOEXIST: a program attached since the query above is not replaced */
		err = bpf_xdp_attach(ifindex, c->prog_fd, XDP_FLAGS_DRV_MODE | XDP_FLAGS_UPDATE_IF_NOEXIST, NULL);
		if (err) {
			die_msg("--dev: native XDP attach of the chain dispatcher to %s failed: %s", dev,
				err == -EBUSY || err == -EEXIST ? "another program was attached meanwhile" : strerror(-err));
			bpf_map_delete_elem(c->progs_fd, &key);
			if (new_dev)
				set_dev_slot(c, slot, 0);
			return err;
		}
	}
	return 0;
}

int xdp_chain_leave(struct xdp_chain *c, const char *netns, const char *dev, enum xdp_chain_role role, int prog_fd)
{
	uint32_t ifindex, slot, key, held, attached = 0, others = 0;
	struct xdp_chain_dev_table t;
	char label[128];
	int err, found;

	if (c->progs_fd < 0 || (unsigned int)role >= XDP_CHAIN_NR_ROLES)
		return -EINVAL;
	err = dev_ifindex(netns, dev, &ifindex) ?: read_devs(c, &t);
	if (err)
		return err;
	found = dev_slot(&t, ifindex);
	if (found < 0) {
		die_msg("--dev: %s is not in the XDP chain of %s", dev, c->instance_dir);
		return -ENOENT;
	}
	slot = found;
	key = slot * XDP_CHAIN_NR_ROLES + role;
	held = slot_prog(c, key);
	if (!held) {
		die_msg("--dev: no %s runs on %s in the XDP chain of %s", xdp_chain_role_names[role], dev,
			c->instance_dir);
		return -ENOENT;
	}
	if (prog_fd >= 0 && held != prog_id_of(prog_fd)) {
		die_msg("--dev: the %s on %s is %s, not program %u", xdp_chain_role_names[role], dev,
			prog_label(held, -1, label, sizeof(label)), prog_id_of(prog_fd));
		return -EPERM;
	}
	for (uint32_t r = 0; r < XDP_CHAIN_NR_ROLES; r++)
		if (r != (uint32_t)role && slot_prog(c, slot * XDP_CHAIN_NR_ROLES + r))
			others++;
	if (!others) {
		/* the last member: the dispatcher leaves the device before the row is freed */
		LIBBPF_OPTS(bpf_xdp_attach_opts, opts, .old_prog_fd = c->prog_fd);

		bpf_xdp_query_id(ifindex, XDP_FLAGS_DRV_MODE, &attached);
		if (attached == c->prog_id) {
			/* REPLACE + old fd: the kernel detaches only if the dispatcher is still the one there */
			err = bpf_xdp_detach(ifindex, XDP_FLAGS_DRV_MODE | XDP_FLAGS_REPLACE, &opts);
			if (err) {
				die_msg("--dev: detaching the chain dispatcher from %s failed: %s", dev, strerror(-err));
				return err;
			}
		} else {
			die_msg("warning: %s runs %s, not the chain dispatcher; leaving that program alone", dev,
				attached ? prog_label(attached, -1, label, sizeof(label)) : "no XDP program");
		}
	}
	if (bpf_map_delete_elem(c->progs_fd, &key) && errno != ENOENT) {
		err = -errno;
		die_msg("cannot empty slot %u of %s/%s: %s", key, c->dir, XDP_CHAIN_PROGS_MAP, strerror(errno));
		return err;
	}
	return others ? 0 : set_dev_slot(c, slot, 0);
}

static bool chain_empty(const struct xdp_chain *c)
{
	struct xdp_chain_dev_table t;

	if (read_devs(c, &t))
		return false;   /* unreadable: keep the pins rather than guess */
	for (int slot = 0; slot < XDP_CHAIN_MAX_DEVS; slot++)
		if (t.ifindex[slot])
			return false;
	return true;
}

void xdp_chain_close(struct xdp_chain *c)
{
	bool remove = c->devs_fd >= 0 && chain_empty(c);

	if (c->progs_fd >= 0)
		close(c->progs_fd);
	if (c->devs_fd >= 0)
		close(c->devs_fd);
	if (c->prog_fd >= 0)
		close(c->prog_fd);
	/* no device left: the pins go (the prog array is emptied with its last pin), so an
	 * instance without XDP programs leaves nothing behind */
	if (remove)
		unpin_dir(c->dir);
	if (c->lock_fd >= 0)
		close(c->lock_fd);   /* releases the flock */
	c->progs_fd = c->devs_fd = c->prog_fd = c->lock_fd = -1;
}

/* ---- show ---- */

struct shown_dev {
	uint32_t ifindex, slot;
	char name[IF_NAMESIZE + 16];
};

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct shown_dev *)a)->name, ((const struct shown_dev *)b)->name);
}

int xdp_chain_show(const char *instance_dir, const char *netns)
{
	struct shown_dev devs[XDP_CHAIN_MAX_DEVS];
	struct xdp_chain_dev_table t = {};
	struct xdp_chain c;
	uint32_t n = 0;
	int err;

	if (check_netns_exists(netns) || (netns && enter_netns(netns)))
		return -ENOENT;
	err = xdp_chain_open(&c, instance_dir, false);
	if (!err && c.devs_fd >= 0)
		err = read_devs(&c, &t);
	if (err) {
		xdp_chain_close(&c);
		return err;
	}
	for (uint32_t slot = 0; slot < XDP_CHAIN_MAX_DEVS; slot++) {
		char ifname[IF_NAMESIZE];

		if (!t.ifindex[slot])
			continue;
		devs[n].ifindex = t.ifindex[slot];
		devs[n].slot = slot;
		if (if_indextoname(t.ifindex[slot], ifname))
			snprintf(devs[n].name, sizeof(devs[n].name), "%s", ifname);
		else   /* not in this netns (or gone): its index is all we know */
			snprintf(devs[n].name, sizeof(devs[n].name), "ifindex %u", t.ifindex[slot]);
		n++;
	}
	qsort(devs, n, sizeof(devs[0]), by_name);
	putchar('{');
	for (uint32_t i = 0; i < n; i++) {
		bool first = true;

		printf("%s\"%s\": [", i ? ", " : "", devs[i].name);
		for (uint32_t role = 0; role < XDP_CHAIN_NR_ROLES; role++) {
			uint32_t id = slot_prog(&c, devs[i].slot * XDP_CHAIN_NR_ROLES + role);
			struct bpf_prog_info info = {};
			uint32_t len = sizeof(info);
			int fd;

			if (!id)
				continue;
			fd = bpf_prog_get_fd_by_id(id);
			if (fd < 0 || bpf_obj_get_info_by_fd(fd, &info, &len))
				info.name[0] = '\0';
			if (fd >= 0)
				close(fd);
			printf("%s{\"role\": \"%s\", \"id\": %u, \"name\": \"%s\"}", first ? "" : ", ",
			       xdp_chain_role_names[role], id, info.name);
			first = false;
		}
		putchar(']');
	}
	printf("}\n");
	xdp_chain_close(&c);
	return 0;
}

/* ---- members ---- */

const char *xdp_member_instance_dir(const char *pin_dir, char *out, size_t len)
{
	const char *slash = strrchr(pin_dir, '/');

	while (slash && slash > pin_dir && slash[1] == '\0') {   /* "DIR/" */
		const char *p = slash - 1;

		while (p > pin_dir && *p != '/')
			p--;
		slash = *p == '/' ? p : NULL;
	}
	if (!slash || slash == pin_dir) {
		die_msg("--pin-dir: '%s' has no parent directory (the instance, which holds %s/)", pin_dir,
			XDP_CHAIN_DIR_NAME);
		return NULL;
	}
	snprintf(out, len, "%.*s", (int)(slash - pin_dir), pin_dir);
	return out;
}

int xdp_member_attach(struct xdp_chain *c, struct bpf_object *obj, struct bpf_program *prog,
		      const char *netns, const char *dev, const char *pin_dir, enum xdp_chain_role role)
{
	int err = pin_object(obj, prog, pin_dir);

	if (!err)
		err = xdp_chain_join(c, netns, dev, role, bpf_program__fd(prog));
	if (err)
		unpin_dir(pin_dir);
	return err;
}

/* Open the instance's chain (existing only) and the member's pinned program. */
static int open_member(struct xdp_chain *c, const char *pin_dir, int *prog_fd)
{
	char inst[PATH_MAX];
	int err;

	*prog_fd = -1;
	if (!xdp_member_instance_dir(pin_dir, inst, sizeof(inst)))
		return -EINVAL;
	err = xdp_chain_open(c, inst, false);
	if (err)
		return err;
	*prog_fd = open_pinned(pin_dir, PROG_PIN_NAME);
	if (*prog_fd < 0) {
		xdp_chain_close(c);
		return -ENOENT;
	}
	return 0;
}

int xdp_member_attach_dev(const char *netns, const char *dev, const char *pin_dir, enum xdp_chain_role role)
{
	struct xdp_chain c;
	char inst[PATH_MAX];
	int prog_fd, err;

	if (!xdp_member_instance_dir(pin_dir, inst, sizeof(inst)))
		return -EINVAL;
	prog_fd = open_pinned(pin_dir, PROG_PIN_NAME);
	if (prog_fd < 0)
		return -ENOENT;
	err = xdp_chain_open(&c, inst, true);
	if (!err) {
		err = xdp_chain_join(&c, netns, dev, role, prog_fd);
		xdp_chain_close(&c);
	}
	close(prog_fd);
	return err;
}

int xdp_member_detach_dev(const char *netns, const char *dev, const char *pin_dir, enum xdp_chain_role role)
{
	struct xdp_chain c;
	int prog_fd, err;

	err = open_member(&c, pin_dir, &prog_fd);
	if (err)
		return err;
	if (c.progs_fd < 0) {
		die_msg("--dev: %s has no XDP chain, so %s runs on no device", c.instance_dir, pin_dir);
		err = -ENOENT;
	} else {
		err = xdp_chain_leave(&c, netns, dev, role, prog_fd);
	}
	close(prog_fd);
	xdp_chain_close(&c);
	return err;
}

static bool row_empty(const struct xdp_chain *c, uint32_t slot)
{
	for (uint32_t role = 0; role < XDP_CHAIN_NR_ROLES; role++)
		if (slot_prog(c, slot * XDP_CHAIN_NR_ROLES + role))
			return false;
	return true;
}

/* A device whose row holds prog_id at role (1, *ifindex and *slot set), or none (0). */
static int find_member(const struct xdp_chain *c, enum xdp_chain_role role, uint32_t prog_id, uint32_t *ifindex,
		       uint32_t *slot)
{
	struct xdp_chain_dev_table t;

	if (read_devs(c, &t))
		return 0;
	for (uint32_t s = 0; s < XDP_CHAIN_MAX_DEVS; s++) {
		if (t.ifindex[s] && slot_prog(c, s * XDP_CHAIN_NR_ROLES + role) == prog_id) {
			*ifindex = t.ifindex[s];
			*slot = s;
			return 1;
		}
	}
	return 0;
}

/* The member leaves every device it still runs on (after `detach --dev`: the ones attach-dev added). */
static int leave_everywhere(struct xdp_chain *c, const char *netns, enum xdp_chain_role role, uint32_t prog_id,
			    int prog_fd)
{
	uint32_t ifindex, slot;

	while (find_member(c, role, prog_id, &ifindex, &slot)) {
		char ifname[IF_NAMESIZE];

		if (if_indextoname(ifindex, ifname)) {
			if (xdp_chain_leave(c, netns, ifname, role, prog_fd))
				return -EIO;
			printf("%s also left %s\n", xdp_chain_role_names[role], ifname);
			continue;
		}
		/* the device is gone, and its XDP program with it: only the slots remain to empty */
		uint32_t key = slot * XDP_CHAIN_NR_ROLES + role;

		bpf_map_delete_elem(c->progs_fd, &key);
		if (row_empty(c, slot) && set_dev_slot(c, slot, 0))
			return -EIO;
	}
	return 0;
}

int xdp_member_leave_all(const char *netns, const char *pin_dir, enum xdp_chain_role role)
{
	struct xdp_chain c;
	int prog_fd, err;

	err = open_member(&c, pin_dir, &prog_fd);
	if (err)
		return err;
	if (c.progs_fd >= 0)
		err = leave_everywhere(&c, netns, role, prog_id_of(prog_fd), prog_fd);
	close(prog_fd);
	xdp_chain_close(&c);
	return err;
}

int xdp_member_detach(const char *netns, const char *dev, const char *pin_dir, enum xdp_chain_role role)
{
	struct xdp_chain c;
	uint32_t prog_id, ifindex;
	int prog_fd, err;

	err = open_member(&c, pin_dir, &prog_fd);
	if (err)
		return err;
	prog_id = prog_id_of(prog_fd);
	err = dev_ifindex(netns, dev, &ifindex);
	if (!err && c.progs_fd < 0) {
		die_msg("warning: %s has no XDP chain, so program %u pinned in %s runs nowhere; removing pins only",
			c.instance_dir, prog_id, pin_dir);
	} else if (!err) {
		struct xdp_chain_dev_table t;
		int slot = read_devs(&c, &t) ? -1 : dev_slot(&t, ifindex);

		if (slot >= 0 && slot_prog(&c, slot * XDP_CHAIN_NR_ROLES + role) == prog_id)
			err = xdp_chain_leave(&c, netns, dev, role, prog_fd);
		else
			die_msg("warning: program %u pinned in %s does not run on %s; removing it from wherever "
				"it runs, and its pins", prog_id, pin_dir, dev);
		if (!err)
			err = leave_everywhere(&c, netns, role, prog_id, prog_fd);
	}
	close(prog_fd);
	if (!err && unpin_dir(pin_dir))
		err = -EIO;
	xdp_chain_close(&c);
	return err;
}
