// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * Loader of the in-line IOAM route program ioam_lwt.bpf.c (`encap bpf in` on the monitored SRv6
 * policy's route; ioam_lwt.h). attach-route loads and pins the program with the first route,
 * writes the route's seg6 encapsulation (SRH, tunnel source, device, MTU) into ioam_lwt_routes and
 * replaces the route `P encap seg6 mode encap segs S dev D` by `P encap bpf in pinned PROG dev D`
 * with one RTM_NEWROUTE(REPLACE) (`ip -6 route replace`: the route is never absent);
 * detach-route puts the seg6 route back the same way and removes the pins with the last route.
 * Beside it attach-route puts the route's copies: the seg6 route (table 3355, for the packets the
 * program marks) and the program's lwt_xmit entry for the packets this node sends (table 3356).
 * Flows, interface ids, TAI-UTC, stats: as ioam_tx (ioam_tx_flows.c), in
 * /sys/fs/bpf/segscope/<instance>/ioam_lwt/.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "ioam_loader.h"
#include "ioam_lwt.h"
#include "ioam_lwt.skel.h"
#include "ioam_tx_flows.h"

const char *loader_name = "ioam_lwt";

/*
 * The copies of a route taken over, each with its rule (a destination not in a table falls through
 * to the next rule; both rules come before main's 32766):
 *   - COPY_TABLE: the seg6 route as it was. Packets that must take the kernel's own seg6 encap but
 *     cannot from the program (GSO packets, and every packet sent here that is not instrumented) get
 *     IOAM_LWT_SEG6_MARK and are re-routed; MARK_RULE sends them here.
 *   - LOCAL_TABLE: the route program's lwt_xmit entry (pinned LOCAL_PIN). Packets this node sends
 *     itself never pass an `encap bpf in` program (lwt_in runs on input): LOCAL_RULE (`iif lo`, locally
 *     sent packets only) gives them this copy, where they are sampled and instrumented like the
 *     forwarded ones. Its headroom is the seg6 encap's, so a local sender sees the MTU it saw before.
 * The mark's rule comes first: a marked packet re-routed from LOCAL_TABLE finds COPY_TABLE.
 */
#define COPY_TABLE  "3355"
#define MARK_RULE   "pref 30054 fwmark " STR(IOAM_LWT_SEG6_MARK) " lookup " COPY_TABLE
#define LOCAL_TABLE "3356"
#define LOCAL_RULE  "pref 30055 iif lo lookup " LOCAL_TABLE
#define LOCAL_PIN   "prog_local"
#define STR_(x) #x
#define STR(x) STR_(x)

static const char usage[] =
	"usage:\n"
	"  ioam_lwt attach-route --instance NAME --prefix PFX/LEN --dev IF --sids A,B,.. [--netns NS]\n"
	"      [--table T] [--metric M] [--mtu N] [--tunsrc ADDR] [--tai-offset S] [--pin-dir DIR] [--fixed-next-hop]\n"
	"      [--flow-sids A,B,..] [--trace-nodes N] [--paused]\n"
	"  ioam_lwt detach-route --instance NAME --prefix PFX/LEN --dev IF --sids A,B,.. [--netns NS]\n"
	"      [--table T] [--metric M]          (the route back to encap seg6 mode encap segs A,B,..)\n"
	"  ioam_lwt list-routes --instance NAME [--json]\n"
	"  ioam_lwt add-flow|del-flow|list-flows|stats|set-if-id|set-tai-offset   (as ioam_tx)\n"
	"attach-route replaces the route PFX/LEN (table T, default 254; metric M, default 1024) that\n"
	"must be `encap seg6 mode encap segs A,B,.. dev IF` by the route program; --mtu: the MTU an\n"
	"instrumented packet must fit (default IF's), --tunsrc: the outer source (default `ip sr tunsrc`,\n"
	"else the address the kernel picks on IF for the first SID); --fixed-next-hop: the route forwards by the\n"
	"first SID's gateway as resolved now (no route lookup per packet; attach again when that route changes).\n"
	"attach-route on a route ioam_lwt already runs rewrites it in place (a steer: new --sids, the next hop\n"
	"again); --flow-sids A,B,..: the flow its packets count in (default --sids: a steered policy keeps its\n"
	"monitor's flow and sequence numbers), --trace-nodes N: the trace slots for this route (default the flow's),\n"
	"--paused: the route only encapsulates (its flow's sampling and sequence numbers stand still).\n"
	"Pins in " IOAM_PIN_ROOT "/NAME/ioam_lwt unless --pin-dir.\n";

/* Run argv (ip ...) in this process's netns; 0 or -1 after a message with its output. */
static int run_ip(char *const argv[])
{
	int status;
	pid_t pid = fork();

	if (pid < 0)
		return -1;
	if (pid == 0) {
		execvp(argv[0], argv);
		fprintf(stderr, "ioam_lwt: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) {
		die_msg("'%s %s %s %s ...' failed (its message above)", argv[0], argv[1], argv[2], argv[3]);
		return -1;
	}
	return 0;
}

/* Run `ip` quietly: 0 if it succeeded (for what may already be there or be gone). */
static int run_ip_quiet(const char *cmd)
{
	char full[1500];

	snprintf(full, sizeof(full), "ip %s >/dev/null 2>&1", cmd);
	return system(full) == 0 ? 0 : -1;
}

/* Is `ip -6 rule show` showing this rule ("pref P <selector> lookup T")? */
static bool rule_present(const char *rule)
{
	char cmd[256];

	/* `ip -6 rule show pref P` prints "P:\tfrom all <selector> lookup T" */
	snprintf(cmd, sizeof(cmd), "ip -6 rule show %s 2>/dev/null | grep -q .", rule);
	return system(cmd) == 0;
}

/* The route's copies (COPY_TABLE, LOCAL_TABLE) and their rules in place (add) or gone (!add). */
static int route_copies(const struct ioam_args *a, const struct ioam_lwt_route *rt, bool add)
{
	char cmd[1400], left[64];
	FILE *f;

	if (!add) {
		/* the local copy first: while it is there, the packets it marks still find the seg6 copy */
		snprintf(cmd, sizeof(cmd), "-6 route del '%s' table " LOCAL_TABLE " metric %llu", a->prefix,
			 (unsigned long long)a->metric);
		run_ip_quiet(cmd);
		snprintf(cmd, sizeof(cmd), "-6 route del '%s' table " COPY_TABLE " metric %llu dev '%s'", a->prefix,
			 (unsigned long long)a->metric, a->dev);
		run_ip_quiet(cmd);
		/* the rules go with the tables' last route */
		f = popen("ip -6 route show table " COPY_TABLE " 2>/dev/null; ip -6 route show table " LOCAL_TABLE
			  " 2>/dev/null", "r");
		left[0] = '\0';
		if (f) {
			if (!fgets(left, sizeof(left), f))
				left[0] = '\0';
			pclose(f);
		}
		if (!left[0]) {
			while (!run_ip_quiet("-6 rule del " LOCAL_RULE))
				;
			while (!run_ip_quiet("-6 rule del " MARK_RULE))
				;
		}
		return 0;
	}
	snprintf(cmd, sizeof(cmd), "ip -6 route replace '%s' table " COPY_TABLE " metric %llu dev '%s' encap seg6 "
		 "mode encap segs '%s'", a->prefix, (unsigned long long)a->metric, a->dev, a->sids);
	if (system(cmd)) {
		die_msg("cannot install the copy of the seg6 route (table " COPY_TABLE "): '%s' failed", cmd);
		return -1;
	}
	/* headroom: the outer IPv6 header and the SRH, what the seg6 route reserves */
	snprintf(cmd, sizeof(cmd), "ip -6 route replace '%s' table " LOCAL_TABLE " metric %llu dev '%s' encap bpf "
		 "xmit pinned '%s/" LOCAL_PIN "' headroom %u", a->prefix, (unsigned long long)a->metric, a->dev,
		 a->pin_dir, (unsigned)(40 + rt->srh_len));
	if (system(cmd)) {
		die_msg("cannot install the route for locally sent packets (table " LOCAL_TABLE "): '%s' failed", cmd);
		return -1;
	}
	/* one pair of rules for every route this node's instances take over */
	if (!rule_present(MARK_RULE) && run_ip_quiet("-6 rule add " MARK_RULE)) {
		die_msg("cannot add the rule `" MARK_RULE "`");
		return -1;
	}
	if (!rule_present(LOCAL_RULE) && run_ip_quiet("-6 rule add " LOCAL_RULE)) {
		die_msg("cannot add the rule `" LOCAL_RULE "`");
		return -1;
	}
	return 0;
}

/* The SRH of `encap seg6 mode encap segs ...`: next header IPv6, segments left = last entry. */
static void build_srh(const struct altmark_sidlist_key *key, struct ioam_lwt_route *rt)
{
	__u32 n = key->nsids;

	rt->srh_len = 8 + 16 * n;
	rt->srh[0] = IPPROTO_IPV6;
	rt->srh[1] = (__u8)(2 * n);
	rt->srh[2] = 4;
	rt->srh[3] = (__u8)(n - 1);
	rt->srh[4] = (__u8)(n - 1);
	memcpy(rt->srh + 8, key->sids, 16 * n);
}

/* The outer source seg6 encap uses: `ip sr tunsrc` if set, else the kernel's choice on dev for sid. */
static int find_tunsrc(const char *dev, const struct in6_addr *first_sid, __u8 out[16])
{
	struct sockaddr_in6 to = {.sin6_family = AF_INET6, .sin6_port = htons(9)}, me;
	socklen_t len = sizeof(me);
	char line[256], addr[INET6_ADDRSTRLEN];
	FILE *f = popen("ip sr tunsrc show 2>/dev/null", "r");
	int fd, err;

	if (f) {
		bool set = fgets(line, sizeof(line), f) && sscanf(line, "tunsrc addr %45s", addr) == 1 &&
			   inet_pton(AF_INET6, addr, out) == 1 && !IN6_IS_ADDR_UNSPECIFIED((struct in6_addr *)out);
		pclose(f);
		if (set)
			return 0;
	}
	to.sin6_addr = *first_sid;
	fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	err = setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, dev, strlen(dev)) ||
	      connect(fd, (struct sockaddr *)&to, sizeof(to)) || getsockname(fd, (struct sockaddr *)&me, &len);
	if (err)
		die_msg("--tunsrc: no source address on %s toward the first SID (%s); give --tunsrc", dev,
			strerror(errno));
	else
		memcpy(out, &me.sin6_addr, 16);
	close(fd);
	return err ? -1 : 0;
}

static int device_mtu(const char *dev, __u32 *mtu)
{
	struct ifreq ifr = {};
	int fd = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0), err;

	if (fd < 0)
		return -1;
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", dev);
	err = ioctl(fd, SIOCGIFMTU, &ifr);
	if (err)
		die_msg("--dev: cannot read the MTU of %s: %s", dev, strerror(errno));
	else
		*mtu = (__u32)ifr.ifr_mtu;
	close(fd);
	return err ? -1 : 0;
}

/*
 * --fixed-next-hop: the first SID's next hop as the kernel resolves it now (`ip -6 route get`): the
 * gateway into gw, the device into dev; -1 after a message if the SID is on-link or unreachable.
 */
static int first_sid_next_hop(const struct in6_addr *sid, char gw[INET6_ADDRSTRLEN], char dev[IF_NAMESIZE])
{
	char cmd[128], line[512], text[INET6_ADDRSTRLEN], *via, *on;
	FILE *f;

	inet_ntop(AF_INET6, sid, text, sizeof(text));
	snprintf(cmd, sizeof(cmd), "ip -6 route get %s 2>&1", text);
	f = popen(cmd, "r");
	if (!f)
		return -1;
	if (!fgets(line, sizeof(line), f))
		line[0] = '\0';
	pclose(f);
	via = strstr(line, " via ");
	on = strstr(line, " dev ");
	if (!via || !on || sscanf(via, " via %45s", gw) != 1 || sscanf(on, " dev %15s", dev) != 1) {
		line[strcspn(line, "\n")] = '\0';
		die_msg("--fixed-next-hop: the first SID %s has no gateway to fix (`ip -6 route get`: %s)", text, line);
		return -1;
	}
	return 0;
}

/* --prefix, --dev, --sids: the route's key and the value attach-route writes. */
static bool parse_route(struct ioam_args *a, struct ioam_lwt_route_key *key, struct altmark_sidlist_key *sids)
{
	__u8 mask[16], len;

	if (!require_arg(a->prefix, "--prefix") || !require_arg(a->dev, "--dev") || !require_arg(a->sids, "--sids"))
		return false;
	if (!ioam_parse_prefix("--prefix", a->prefix, key->addr, mask, &len) || !ioam_parse_sids(a->sids, sids))
		return false;
	key->prefixlen = len;
	return true;
}

/* --flow-sids (default --sids): the flow the route's packets count in; --trace-nodes: its trace size. */
static bool parse_flow(struct ioam_args *a, struct ioam_lwt_route *rt)
{
	if (!a->flow_sids) {
		rt->flow = rt->sids;
	} else if (!ioam_parse_sids(a->flow_sids, &rt->flow)) {
		return false;
	}
	rt->trace_nodes = a->have_trace_nodes ? (__u32)a->trace_nodes : 0;
	return true;
}

/*
 * The pinned programs (prog: lwt_in, LOCAL_PIN: lwt_xmit) and maps, loaded and pinned by the first
 * route. Pins of an instance that has prog but not LOCAL_PIN get it, on the maps pinned there.
 */
static int load_once(struct ioam_args *a)
{
	char prog_path[600], local_path[600];
	struct ioam_lwt_bpf *skel;
	bool fresh;
	int err;

	snprintf(prog_path, sizeof(prog_path), "%s/" PROG_PIN_NAME, a->pin_dir);
	snprintf(local_path, sizeof(local_path), "%s/" LOCAL_PIN, a->pin_dir);
	fresh = access(prog_path, F_OK) != 0;
	if (!fresh && !access(local_path, F_OK))
		return 0;
	if (fresh && prepare_pin_dir(NULL, a->pin_dir, "ioam_lwt"))
		return -1;
	skel = ioam_lwt_bpf__open();
	err = skel ? 0 : -errno;
	if (!err && !fresh)
		err = reuse_pinned_maps(skel->obj, a->pin_dir, &(bool){false});
	if (!err)
		err = ioam_lwt_bpf__load(skel);
	if (err) {
		die_msg("cannot load BPF program (verifier log above): %s", strerror(-err));
		ioam_lwt_bpf__destroy(skel);
		if (fresh)
			unpin_dir(a->pin_dir);
		return -1;
	}
	if (fresh)
		err = ioam_tx_write_config(bpf_map__fd(skel->maps.ioam_tx_config), a);
	if (!err && fresh)
		err = pin_object(skel->obj, skel->progs.ioam_lwt, a->pin_dir);
	if (!err)   /* every map is pinned by now: only the entry */
		err = pin_object_as(skel->obj, skel->progs.ioam_lwt_local, a->pin_dir, LOCAL_PIN, true);
	if (err && fresh)
		unpin_dir(a->pin_dir);
	ioam_lwt_bpf__destroy(skel);
	return err;
}

static int routes_left(const char *pin_dir)
{
	struct ioam_lwt_route_key key;
	int fd = open_pinned(pin_dir, "ioam_lwt_routes"), n;

	if (fd < 0)
		return -1;
	n = !bpf_map_get_next_key(fd, NULL, &key);
	close(fd);
	return n;
}

/*
 * The route attach-route replaces must be the policy's seg6 encap route with these SIDs on --dev
 * (or already this program's, from an earlier attach-route): 0, or -1 after a message saying what
 * `ip -6 route show` has instead.
 */
static int check_route(const struct ioam_args *a, const struct altmark_sidlist_key *sids, bool ours)
{
	char cmd[256], line[1024] = "", want[16 * INET6_ADDRSTRLEN + 64], dev[64];
	size_t n;
	FILE *f;

	snprintf(cmd, sizeof(cmd), "ip -6 route show table %llu exact '%s' 2>&1", (unsigned long long)a->table,
		 a->prefix);
	f = popen(cmd, "r");
	if (!f || !fgets(line, sizeof(line), f)) {
		if (f)
			pclose(f);
		die_msg("--prefix: no route %s in table %llu to take over", a->prefix, (unsigned long long)a->table);
		return -1;
	}
	pclose(f);
	line[strcspn(line, "\n")] = '\0';
	n = (size_t)snprintf(want, sizeof(want), "encap seg6 mode encap segs %u [ ", sids->nsids);
	for (int i = (int)sids->nsids - 1; i >= 0 && n < sizeof(want); i--) {   /* travel order */
		inet_ntop(AF_INET6, &sids->sids[i], want + n, (socklen_t)(sizeof(want) - n));
		n = strlen(want);
		n += (size_t)snprintf(want + n, sizeof(want) - n, " ");
	}
	snprintf(want + n, sizeof(want) - n, "]");
	snprintf(dev, sizeof(dev), " dev %s ", a->dev);
	/* ours: a fixed next hop may have put it on another device (the first SID's gateway's) */
	if ((strstr(line, dev) && strstr(line, want)) || (ours && strstr(line, "encap bpf in")))
		return 0;
	die_msg("--prefix/--sids/--dev: the route is `%s`, not `%s ... dev %s`: ioam_lwt takes over only the "
		"policy's seg6 encap route (other modes: ioam_tx on TC egress)", line, want, a->dev);
	return -1;
}

static int run_attach_route(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct ioam_lwt_route_key key = {};
	struct ioam_lwt_route rt = {};
	char table[16], metric[16], pinned[600], gw[INET6_ADDRSTRLEN] = "", gw_dev[IF_NAMESIZE] = "";
	const char *out_dev;
	__u8 old_tunsrc[16] = {};
	int fd, ifindex, err;
	bool ours;

	if (!ioam_resolve_pin_dir(prog, a) || !parse_route(a, &key, &rt.sids) || !parse_flow(a, &rt))
		return EXIT_USAGE;
	if (a->tunsrc && !parse_ipv6_arg("--tunsrc", a->tunsrc, rt.tunsrc))
		return EXIT_USAGE;
	if (load_once(a))   /* in this netns: the pins are in its mount namespace, not the netns */
		return EXIT_FAIL;
	fd = open_pinned(a->pin_dir, "ioam_lwt_routes");
	if (fd < 0 || enter_netns(a->netns) || (ifindex = resolve_ifindex(a->dev)) < 0)
		goto fail;
	ours = !bpf_map_lookup_elem(fd, &key, &rt);
	if (check_route(a, &rt.sids, ours))
		goto fail;
	/* a rewrite keeps the outer source: the flow's packets keep theirs when the next hop moves */
	if (ours && !a->tunsrc)
		memcpy(old_tunsrc, rt.tunsrc, sizeof(old_tunsrc));
	memset(&rt, 0, sizeof(rt));
	memcpy(rt.tunsrc, old_tunsrc, sizeof(rt.tunsrc));
	if (!parse_route(a, &key, &rt.sids) || !parse_flow(a, &rt) ||
	    (a->tunsrc && !parse_ipv6_arg("--tunsrc", a->tunsrc, rt.tunsrc)))
		goto fail;
	build_srh(&rt.sids, &rt);
	out_dev = a->dev;
	if (a->fixed_next_hop) {
		/* the packets leave by the first SID's route, fixed now: its device is the trace's egress */
		if (first_sid_next_hop(&rt.sids.sids[rt.sids.nsids - 1], gw, gw_dev) ||
		    (ifindex = resolve_ifindex(gw_dev)) < 0)
			goto fail;
		out_dev = gw_dev;
		rt.flags |= IOAM_LWT_FIXED_NEXT_HOP;
	}
	if (a->paused)
		rt.flags |= IOAM_LWT_PAUSED;
	rt.oif = (__u32)ifindex;
	rt.mtu = (__u32)a->mtu;
	if ((!a->mtu && device_mtu(out_dev, &rt.mtu)) ||
	    (!a->tunsrc && !ours && find_tunsrc(a->dev, &rt.sids.sids[rt.sids.nsids - 1], rt.tunsrc)))
		goto fail;
	/* the entry first: the program finds it from the first packet the new route gives it */
	if (bpf_map_update_elem(fd, &key, &rt, BPF_ANY)) {
		die_msg("cannot write ioam_lwt_routes in %s: %s", a->pin_dir, strerror(errno));
		goto fail;
	}
	snprintf(table, sizeof(table), "%llu", (unsigned long long)a->table);
	snprintf(metric, sizeof(metric), "%llu", (unsigned long long)a->metric);
	snprintf(pinned, sizeof(pinned), "%s/" PROG_PIN_NAME, a->pin_dir);
	/* first the route's copies (locally sent and marked packets), then the route itself */
	err = route_copies(a, &rt, true);
	if (!err)
		err = a->fixed_next_hop
			      ? run_ip((char *const[]){"ip", "-6", "route", "replace", (char *)a->prefix, "table", table,
						       "metric", metric, "via", gw, "dev", gw_dev, "encap", "bpf", "in",
						       "pinned", pinned, NULL})
			      : run_ip((char *const[]){"ip", "-6", "route", "replace", (char *)a->prefix, "table", table,
						       "metric", metric, "dev", (char *)a->dev, "encap", "bpf", "in",
						       "pinned", pinned, NULL});
	if (err && ours) {
		/* a rewrite: the route still runs the program, with the entry just written */
		close(fd);
		return EXIT_FAIL;
	}
	if (err) {
		route_copies(a, &rt, false);
		bpf_map_delete_elem(fd, &key);
		goto fail;
	}
	printf("route %s dev %s: ioam_lwt (pinned in %s) in place of encap seg6 segs %s\n", a->prefix, a->dev,
	       a->pin_dir, a->sids);
	close(fd);
	return EXIT_OK;
fail:
	if (fd >= 0)
		close(fd);
	if (routes_left(a->pin_dir) == 0)
		unpin_dir(a->pin_dir);
	return EXIT_FAIL;
}

static int run_detach_route(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct ioam_lwt_route_key key = {};
	struct altmark_sidlist_key sids;
	char table[16], metric[16], segs[8 * INET6_ADDRSTRLEN], pinned[600];
	int fd, err;

	if (!ioam_resolve_pin_dir(prog, a) || !parse_route(a, &key, &sids))
		return EXIT_USAGE;
	/* pins gone (a lost bpffs, a crash that took them): the route holds the program and still
	 * works; it is given back all the same */
	snprintf(pinned, sizeof(pinned), "%s/ioam_lwt_routes", a->pin_dir);
	fd = access(pinned, F_OK) ? -1 : open_pinned(a->pin_dir, "ioam_lwt_routes");
	if (fd < 0)
		die_msg("warning: no pins in %s; giving the route back without them", a->pin_dir);
	if (enter_netns(a->netns)) {
		if (fd >= 0)
			close(fd);
		return EXIT_FAIL;
	}
	snprintf(table, sizeof(table), "%llu", (unsigned long long)a->table);
	snprintf(metric, sizeof(metric), "%llu", (unsigned long long)a->metric);
	snprintf(segs, sizeof(segs), "%s", a->sids);
	err = run_ip((char *const[]){"ip", "-6", "route", "replace", (char *)a->prefix, "table", table, "metric",
				     metric, "dev", (char *)a->dev, "encap", "seg6", "mode", "encap", "segs", segs,
				     NULL});
	/* the entry goes after the route and its local copy: no packet reaches the program without one */
	if (!err) {
		err = route_copies(a, NULL, false);
		if (fd >= 0)
			bpf_map_delete_elem(fd, &key);
	}
	if (fd >= 0)
		close(fd);
	if (!err && fd >= 0 && routes_left(a->pin_dir) == 0 && unpin_dir(a->pin_dir))
		err = -1;
	if (!err)
		printf("route %s dev %s: encap seg6 mode encap segs %s again\n", a->prefix, a->dev, a->sids);
	return err ? EXIT_FAIL : EXIT_OK;
}

static int run_list_routes(void *args, const void *prog)
{
	struct ioam_args *a = args;
	struct ioam_lwt_route_key key, next;
	struct ioam_lwt_route rt;
	char addr[INET6_ADDRSTRLEN], src[INET6_ADDRSTRLEN];
	void *prev = NULL;
	bool first = true;
	int fd;

	if (!ioam_resolve_pin_dir(prog, a))
		return EXIT_USAGE;
	fd = open_pinned(a->pin_dir, "ioam_lwt_routes");
	if (fd < 0)
		return EXIT_FAIL;
	printf(a->json ? "{\"program\": \"ioam_lwt\", \"pin_dir\": \"%s\", \"routes\": [" : "routes of %s\n",
	       a->pin_dir);
	while (!bpf_map_get_next_key(fd, prev, &next)) {
		key = next;
		prev = &key;
		if (bpf_map_lookup_elem(fd, &key, &rt))
			continue;
		inet_ntop(AF_INET6, key.addr, addr, sizeof(addr));
		inet_ntop(AF_INET6, rt.tunsrc, src, sizeof(src));
		if (!a->json) {
			printf("%s/%u oif %u mtu %u tunsrc %s\n", addr, key.prefixlen, rt.oif, rt.mtu, src);
			continue;
		}
		printf("%s{\"prefix\": \"%s/%u\", \"oif\": %u, \"mtu\": %u, \"tunsrc\": \"%s\", \"fixed_next_hop\": %s, "
		       "\"paused\": %s, \"trace_nodes\": %u, \"sids\": ", first ? "" : ", ", addr, key.prefixlen, rt.oif,
		       rt.mtu, src, rt.flags & IOAM_LWT_FIXED_NEXT_HOP ? "true" : "false",
		       rt.flags & IOAM_LWT_PAUSED ? "true" : "false", rt.trace_nodes);
		ioam_print_sids_json(&rt.sids);
		printf(", \"flow_sids\": ");
		ioam_print_sids_json(&rt.flow);
		printf("}");
		first = false;
	}
	if (a->json)
		printf("]}\n");
	close(fd);
	return EXIT_OK;
}

static const struct loader_cmd commands[] = {
	{"attach-route", run_attach_route},
	{"detach-route", run_detach_route},
	{"list-routes", run_list_routes},
	{"add-flow", ioam_tx_add_flow},
	{"del-flow", ioam_tx_del_flow},
	{"list-flows", ioam_tx_list_flows},
	{"stats", ioam_run_stats},
	{"set-if-id", ioam_tx_set_if_id},
	{"set-tai-offset", ioam_tx_set_tai_offset},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	static const struct ioam_prog prog = {
		.name = "ioam_lwt",
		.commands = commands,
		.usage = usage,
		.counter_names = ioam_lwt_counter_names,
		.n_counters = IOLWT_NR_COUNTERS,
		.stats_map = "ioam_lwt_stats",
	};

	return ioam_main(&prog, argc, argv);
}
