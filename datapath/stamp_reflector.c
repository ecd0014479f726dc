// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * stamp_reflector: loader and control tool of the XDP STAMP Session-Reflector.
 *
 *   stamp_reflector attach --netns NS --dev IF --pin-dir DIR [--port 862] [--tai-offset S]
 *                   [--partial-csum accept|drop]
 *                   [--base-senders on|off]
 *   stamp_reflector add-address --pin-dir DIR ADDR
 *   stamp_reflector del-address --pin-dir DIR ADDR
 *   stamp_reflector add-session --pin-dir DIR --ssid N [--sender ADDR] [--return-sids A,B,...]
 *                   [--format ptp|ntp] [--stateful] [--tlv echo|userspace]
 *                   [--mode unauthenticated|authenticated]
 *   stamp_reflector del-session --pin-dir DIR --ssid N [--sender ADDR]
 *   stamp_reflector set-err-est --pin-dir DIR --err-est N
 *   stamp_reflector set-tai-offset --pin-dir DIR [--tai-offset S]   (default: adjtimex)
 *   stamp_reflector stats --pin-dir DIR [--json]
 *   stamp_reflector test-run --pin-dir DIR --hex FRAME [--repeat N]
 *   stamp_reflector detach --netns NS --dev IF --pin-dir DIR
 *   stamp_reflector attach-dev --netns NS --dev IF --pin-dir DIR
 *   stamp_reflector detach-dev --netns NS --dev IF --pin-dir DIR
 *   stamp_reflector chain [--netns NS] --pin-dir DIR
 *
 * DIR holds this program's pins, by convention
 * /sys/fs/bpf/segscope/<instance>/stamp_reflector. The program runs in the XDP
 * chain of the instance (xdp_chain.h: <instance>/xdp_chain), last of the
 * roles, and stays there after the loader exits; maps are pinned so later
 * commands find them.
 */
#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include "stamp_reflector.h"
#include "stamp_test_packet.h"
#include "stamp_error_estimate.h"
#include "stamp_reflector.skel.h"
#include "loader_util.h"
#include "xdp_chain.h"

const char *loader_name = "stamp_reflector";

struct args {
	const char *netns, *dev, *pin_dir, *sender, *return_sids, *hex;
	uint64_t port, ssid, err_est, repeat;
	int64_t tai_offset;
	uint32_t session_flags;   /* REFL_SESS_F_* from --format/--stateful/--tlv/--mode */
	bool have_ssid, have_err_est, have_tai_offset, json;
	bool drop_partial_csum;   /* attach --partial-csum drop */
	bool no_base_senders;     /* attach --base-senders off */
	const char *positional;
};

enum { OPT_NETNS = 256, OPT_DEV, OPT_PIN_DIR, OPT_PORT, OPT_SSID, OPT_SENDER, OPT_RETURN_SIDS,
       OPT_ERR_EST, OPT_JSON, OPT_HEX, OPT_REPEAT, OPT_FORMAT, OPT_STATEFUL, OPT_TLV, OPT_MODE,
       OPT_TAI_OFFSET, OPT_PARTIAL_CSUM, OPT_BASE_SENDERS };

static const char *const format_names[] = { "ptp", "ntp" };
static const char *const tlv_names[] = { "userspace", "echo" };
static const char *const mode_names[] = { "unauthenticated", "authenticated" };
static const char *const partial_csum_names[] = { "accept", "drop" };
static const char *const on_off_names[] = { "on", "off" };

static const struct option long_opts[] = {
	{ "netns", required_argument, NULL, OPT_NETNS },
	{ "dev", required_argument, NULL, OPT_DEV },
	{ "pin-dir", required_argument, NULL, OPT_PIN_DIR },
	{ "port", required_argument, NULL, OPT_PORT },
	{ "ssid", required_argument, NULL, OPT_SSID },
	{ "sender", required_argument, NULL, OPT_SENDER },
	{ "return-sids", required_argument, NULL, OPT_RETURN_SIDS },
	{ "err-est", required_argument, NULL, OPT_ERR_EST },
	{ "json", no_argument, NULL, OPT_JSON },
	{ "hex", required_argument, NULL, OPT_HEX },
	{ "repeat", required_argument, NULL, OPT_REPEAT },
	{ "format", required_argument, NULL, OPT_FORMAT },
	{ "stateful", no_argument, NULL, OPT_STATEFUL },
	{ "tlv", required_argument, NULL, OPT_TLV },
	{ "mode", required_argument, NULL, OPT_MODE },
	{ "tai-offset", required_argument, NULL, OPT_TAI_OFFSET },
	{ "partial-csum", required_argument, NULL, OPT_PARTIAL_CSUM },
	{ "base-senders", required_argument, NULL, OPT_BASE_SENDERS },
	{ "help", no_argument, NULL, 'h' },
	{},
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage:\n"
		"  stamp_reflector attach --netns NS --dev IF --pin-dir DIR [--port 862] [--tai-offset S]\n"
		"                  [--partial-csum accept|drop]\n"
		"                  [--base-senders on|off]\n"
		"      joins the XDP chain of IF (<dirname DIR>/xdp_chain: altmark_rx, ioam_rx, stamp_collector\n"
		"      run before it on the same device, in any order of attach)\n"
		"      --partial-csum accept (default): answer test packets whose UDP checksum is the\n"
		"      pseudo-header sum only (kernel-socket senders behind a veth: pods, containers), with a\n"
		"      full checksum, counted reflected_partial_csum; drop: count drop_malformed_udp_csum\n"
		"      --base-senders on (default): answer RFC 8762 senders that leave the SSID 0 (session\n"
		"      {any sender, ssid 0}: stateless, NTP); off: leave them to user space (pass_unknown_session)\n"
		"  stamp_reflector add-address --pin-dir DIR ADDR\n"
		"  stamp_reflector del-address --pin-dir DIR ADDR\n"
		"  stamp_reflector add-session --pin-dir DIR --ssid N(0-65535) [--sender ADDR] [--return-sids A,B,...]\n"
		"                  [--format ptp|ntp] [--stateful] [--tlv echo|userspace]\n"
		"                  [--mode unauthenticated|authenticated]\n"
		"  stamp_reflector del-session --pin-dir DIR --ssid N [--sender ADDR]\n"
		"  stamp_reflector set-err-est --pin-dir DIR --err-est N   (S|scale|mult; Z follows each session's format)\n"
		"  stamp_reflector set-tai-offset --pin-dir DIR [--tai-offset S]   (TAI-UTC; default from adjtimex)\n"
		"  stamp_reflector stats --pin-dir DIR [--json]\n"
		"  stamp_reflector test-run --pin-dir DIR --hex FRAME [--repeat N]\n"
		"  stamp_reflector detach --netns NS --dev IF --pin-dir DIR   (leaves IF and every other device, removes pins)\n"
		"  stamp_reflector attach-dev --netns NS --dev IF --pin-dir DIR   (the attached program on one more device)\n"
		"  stamp_reflector detach-dev --netns NS --dev IF --pin-dir DIR   (from that device only; pins stay)\n"
		"  stamp_reflector chain [--netns NS] --pin-dir DIR   (JSON: every device of the instance's XDP chain\n"
		"                  and its members in the order they see a packet)\n"
		"exit codes: 0 ok, 1 failed, 2 bad arguments\n");
}

static int parse_args(int argc, char **argv, struct args *a)
{
	int opt;

	memset(a, 0, sizeof(*a));
	a->port = STAMP_PORT;
	a->repeat = 1;
	optind = 1;
	while ((opt = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
		switch (opt) {
		case OPT_NETNS: a->netns = optarg; break;
		case OPT_DEV: a->dev = optarg; break;
		case OPT_PIN_DIR: a->pin_dir = optarg; break;
		case OPT_PORT:
			if (!parse_u64_arg("--port", optarg, 1, 65535, &a->port))
				return -1;
			break;
		case OPT_SSID:
			/* 0: an RFC 8762 sender that has no SSID (bytes 14-15 of its packet are MBZ) */
			if (!parse_u64_arg("--ssid", optarg, 0, 65535, &a->ssid))
				return -1;
			a->have_ssid = true;
			break;
		case OPT_SENDER: a->sender = optarg; break;
		case OPT_RETURN_SIDS: a->return_sids = optarg; break;
		case OPT_ERR_EST:
			if (!parse_u64_arg("--err-est", optarg, 0, 65535, &a->err_est))
				return -1;
			a->have_err_est = true;
			break;
		case OPT_FORMAT:
			switch (parse_choice_arg("--format", optarg, format_names, 2)) {
			case 0: a->session_flags &= ~REFL_SESS_F_NTP; break;
			case 1: a->session_flags |= REFL_SESS_F_NTP; break;
			default: return -1;
			}
			break;
		case OPT_STATEFUL: a->session_flags |= REFL_SESS_F_STATEFUL; break;
		case OPT_TLV:
			switch (parse_choice_arg("--tlv", optarg, tlv_names, 2)) {
			case 0: a->session_flags &= ~REFL_SESS_F_TLV_ECHO; break;
			case 1: a->session_flags |= REFL_SESS_F_TLV_ECHO; break;
			default: return -1;
			}
			break;
		case OPT_MODE:
			switch (parse_choice_arg("--mode", optarg, mode_names, 2)) {
			case 0: a->session_flags &= ~REFL_SESS_F_AUTHENTICATED; break;
			case 1: a->session_flags |= REFL_SESS_F_AUTHENTICATED; break;
			default: return -1;
			}
			break;
		case OPT_TAI_OFFSET:
			if (!parse_s64_arg("--tai-offset", optarg, TAI_OFFSET_MIN, TAI_OFFSET_MAX, &a->tai_offset))
				return -1;
			a->have_tai_offset = true;
			break;
		case OPT_PARTIAL_CSUM:
			switch (parse_choice_arg("--partial-csum", optarg, partial_csum_names, 2)) {
			case 0: a->drop_partial_csum = false; break;
			case 1: a->drop_partial_csum = true; break;
			default: return -1;
			}
			break;
		case OPT_BASE_SENDERS:
			switch (parse_choice_arg("--base-senders", optarg, on_off_names, 2)) {
			case 0: a->no_base_senders = false; break;
			case 1: a->no_base_senders = true; break;
			default: return -1;
			}
			break;
		case OPT_JSON: a->json = true; break;
		case OPT_HEX: a->hex = optarg; break;
		case OPT_REPEAT:
			if (!parse_u64_arg("--repeat", optarg, 1, 1000000, &a->repeat))
				return -1;
			break;
		case 'h': usage(stdout); exit(EXIT_OK);
		default: usage(stderr); return -1;
		}
	}
	if (optind < argc)
		a->positional = argv[optind++];
	if (optind < argc) {
		die_msg("unexpected argument '%s'", argv[optind]);
		return -1;
	}
	return 0;
}

/* --tai-offset if given, else what the kernel says (adjtimex). */
static int tai_offset_arg_or_host(const struct args *a, int32_t *offset_s)
{
	if (a->have_tai_offset) {
		*offset_s = (int32_t)a->tai_offset;
		return 0;
	}
	return host_tai_utc_offset(offset_s);
}

static int cmd_attach(struct args *a)
{
	struct reflector_config cfg = {};
	struct stamp_reflector_bpf *skel;
	struct xdp_chain chain;
	char inst[PATH_MAX];
	int err;

	if (!require_arg(a->dev, "--dev") || !require_arg(a->pin_dir, "--pin-dir"))
		return EXIT_USAGE;
	if (tai_offset_arg_or_host(a, &cfg.tai_utc_offset_s))
		return EXIT_FAIL;
	/* An honest Error Estimate from the first packet on (RFC 8762 §4.2.1: S from the
	 * clock's sync state, scale/multiplier from its error; a Multiplier of 0 would be
	 * invalid). The program sets Z per session format; set-err-est can refresh it. */
	{
		struct stamp_clock_state cs;

		if (stamp_clock_read(&cs)) {
			die_msg("adjtimex: %s (needed for the Error Estimate)", strerror(errno));
			return EXIT_FAIL;
		}
		cfg.err_est = stamp_ee_from_clock(&cs, STAMP_TS_PTP);
	}
	if (prepare_pin_dir(a->netns, a->pin_dir, "reflector"))
		return EXIT_FAIL;
	skel = stamp_reflector_bpf__open();
	if (!skel) {
		die_msg("cannot open BPF object: %s", strerror(errno));
		unpin_dir(a->pin_dir);
		return EXIT_FAIL;
	}
	skel->rodata->stamp_port = a->port;
	skel->rodata->accept_partial_csum = !a->drop_partial_csum;
	/* the chain is locked from here to its close: no other loader of the instance changes it meanwhile */
	err = xdp_member_instance_dir(a->pin_dir, inst, sizeof(inst)) ? xdp_chain_open(&chain, inst, true) : -EINVAL;
	if (err) {
		unpin_dir(a->pin_dir);
		goto out;
	}
	err = xdp_chain_reuse_maps(&chain, skel->obj);
	if (!err) {
		err = stamp_reflector_bpf__load(skel);
		if (err)
			die_msg("cannot load BPF program (verifier log above): %s", strerror(-err));
	}
	/* the config is in place before the program sees a packet */
	if (!err)
		err = write_config_map(bpf_map__fd(skel->maps.reflector_config), &cfg, "reflector_config");
	if (!err && !a->no_base_senders) {
		/* RFC 8762 senders (no RFC 8972 SSID: bytes 14-15 zero) get answers from the
		 * first packet on: {any sender, ssid 0}, stateless, NTP (RFC 8762's default
		 * format; the reply's Z bit says so either way). add-session/del-session
		 * --ssid 0 change or remove it. */
		struct reflector_session_key key = {};
		struct reflector_session base = { .flags = REFL_SESS_F_NTP };

		err = bpf_map_update_elem(bpf_map__fd(skel->maps.reflector_sessions), &key, &base, BPF_ANY);
		if (err)
			die_msg("insert of the base-sender session {::, ssid 0} failed: %s", strerror(errno));
	}
	if (!err)
		err = xdp_member_attach(&chain, skel->obj, skel->progs.stamp_reflector, a->netns, a->dev, a->pin_dir,
					XDP_CHAIN_STAMP_REFLECTOR);
	else
		unpin_dir(a->pin_dir);
	xdp_chain_close(&chain);
	if (!err)
		printf("stamp_reflector attached to %s%s%s (port %llu, TAI-UTC %d s, partial checksums %s, base senders %s), "
		       "pins in %s\n",
		       a->dev, a->netns ? " in netns " : "", a->netns ? a->netns : "",
		       (unsigned long long)a->port, cfg.tai_utc_offset_s,
		       a->drop_partial_csum ? "dropped" : "accepted", a->no_base_senders ? "off" : "on", a->pin_dir);
out:
	stamp_reflector_bpf__destroy(skel);
	return err ? EXIT_FAIL : EXIT_OK;
}

/* Index of addr in set->addrs[0..n), or -1. */
static int find_address(const struct reflector_address_set *set, const uint8_t addr[16])
{
	for (uint32_t i = 0; i < set->n && i < REFLECTOR_MAX_ADDRESSES; i++)
		if (!memcmp(set->addrs[i], addr, 16))
			return i;
	return -1;
}

/*
 * Add (idempotent) or delete one address. The set is rewritten as a whole;
 * a delete moves the last address into the freed slot so addrs[0..n) stays
 * compact for the program's scan.
 */
static int cmd_address(struct args *a, bool add)
{
	struct reflector_address_set set;
	uint8_t addr[16];
	uint32_t zero = 0;
	int fd, err, idx;

	if (!require_arg(a->pin_dir, "--pin-dir") || !require_arg(a->positional, "ADDR"))
		return EXIT_USAGE;
	if (!parse_ipv6_arg("ADDR", a->positional, addr))
		return EXIT_USAGE;
	fd = open_pinned(a->pin_dir, "reflector_addresses");
	if (fd < 0)
		return EXIT_FAIL;
	err = bpf_map_lookup_elem(fd, &zero, &set);
	if (err) {
		die_msg("read of reflector_addresses failed: %s", strerror(errno));
		goto out;
	}
	if (set.n > REFLECTOR_MAX_ADDRESSES)
		set.n = REFLECTOR_MAX_ADDRESSES;
	idx = find_address(&set, addr);
	if (add && idx >= 0)
		goto out;   /* already there */
	if (add && set.n == REFLECTOR_MAX_ADDRESSES) {
		die_msg("ADDR: cannot add %s, the reflector already has %d addresses", a->positional,
			REFLECTOR_MAX_ADDRESSES);
		err = -1;
		goto out;
	}
	if (!add && idx < 0) {
		die_msg("ADDR: %s is not a reflector address", a->positional);
		err = -1;
		goto out;
	}
	if (add) {
		memcpy(set.addrs[set.n++], addr, 16);
	} else {
		memcpy(set.addrs[idx], set.addrs[set.n - 1], 16);
		memset(set.addrs[--set.n], 0, 16);
	}
	err = bpf_map_update_elem(fd, &zero, &set, BPF_ANY);
	if (err)
		die_msg("update of reflector_addresses (%s %s) failed: %s", add ? "add" : "delete",
			a->positional, strerror(errno));
out:
	close(fd);
	return err ? EXIT_FAIL : EXIT_OK;
}

/* "A,B,C" -> sids in visiting order; refuses more than REFLECTOR_MAX_RETURN_SIDS. */
static int parse_return_sids(const char *text, struct reflector_session *sess)
{
	char *copy = strdup(text), *save = NULL, *tok;
	int n = 0, rc = 0;

	if (!copy)
		return -ENOMEM;
	for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (n == REFLECTOR_MAX_RETURN_SIDS) {
			die_msg("--return-sids: more than %d SIDs (the reflector appends the sender as the final segment)",
				REFLECTOR_MAX_RETURN_SIDS);
			rc = -E2BIG;
			break;
		}
		if (!parse_ipv6_arg("--return-sids", tok, sess->return_sids[n])) {
			rc = -EINVAL;
			break;
		}
		n++;
	}
	if (!rc && n == 0) {
		die_msg("--return-sids: empty list");
		rc = -EINVAL;
	}
	sess->n_return_sids = n;
	free(copy);
	return rc;
}

static int session_key(struct args *a, struct reflector_session_key *key)
{
	memset(key, 0, sizeof(*key));
	if (!require_arg(a->pin_dir, "--pin-dir"))
		return -1;
	if (!a->have_ssid) {
		die_msg("missing required --ssid");
		return -1;
	}
	key->ssid = a->ssid;
	if (a->sender && !parse_ipv6_arg("--sender", a->sender, key->sender))
		return -1;
	return 0;
}

static int cmd_add_session(struct args *a)
{
	struct reflector_session_key key;
	struct reflector_session sess = {};
	int fd, err;

	if (session_key(a, &key))
		return EXIT_USAGE;
	if (a->return_sids && parse_return_sids(a->return_sids, &sess))
		return EXIT_USAGE;
	sess.flags = a->session_flags;
	sess.next_seq = 0;   /* stateful: the first reply carries 0 (a re-added session starts over) */
	fd = open_pinned(a->pin_dir, "reflector_sessions");
	if (fd < 0)
		return EXIT_FAIL;
	err = bpf_map_update_elem(fd, &key, &sess, BPF_ANY);
	if (err)
		die_msg("insert of session ssid %u failed: %s", key.ssid, strerror(errno));
	close(fd);
	return err ? EXIT_FAIL : EXIT_OK;
}

static int cmd_del_session(struct args *a)
{
	struct reflector_session_key key;
	int fd, err;

	if (session_key(a, &key))
		return EXIT_USAGE;
	fd = open_pinned(a->pin_dir, "reflector_sessions");
	if (fd < 0)
		return EXIT_FAIL;
	err = bpf_map_delete_elem(fd, &key);
	if (err && errno == ENOENT)
		die_msg("--ssid: no session %u from sender %s is configured (add-session creates one)",
			key.ssid, a->sender ? a->sender : "::");
	else if (err)
		die_msg("delete of session ssid %u (sender %s) failed: %s", key.ssid,
			a->sender ? a->sender : "::", strerror(errno));
	close(fd);
	return err ? EXIT_FAIL : EXIT_OK;
}

/* Read-modify-write of one config field (err_est or the TAI offset). */
static int update_config(struct args *a, bool err_est)
{
	struct reflector_config cfg = {};
	uint32_t zero = 0;
	int32_t offset_s = 0;
	int fd, err;

	if (!require_arg(a->pin_dir, "--pin-dir"))
		return EXIT_USAGE;
	if (err_est && !a->have_err_est) {
		die_msg("missing required --err-est");
		return EXIT_USAGE;
	}
	if (!err_est && tai_offset_arg_or_host(a, &offset_s))
		return EXIT_FAIL;
	fd = open_pinned(a->pin_dir, "reflector_config");
	if (fd < 0)
		return EXIT_FAIL;
	err = bpf_map_lookup_elem(fd, &zero, &cfg);
	if (err)
		die_msg("read of reflector_config failed: %s", strerror(errno));
	if (!err) {
		if (err_est)
			cfg.err_est = a->err_est;
		else
			cfg.tai_utc_offset_s = offset_s;
		err = write_config_map(fd, &cfg, "reflector_config");
	}
	close(fd);
	return err ? EXIT_FAIL : EXIT_OK;
}

/* Subcommand handlers of the dispatch table (args is struct args *). */
static int run_attach(void *a, const void *ctx) { (void)ctx; return cmd_attach(a); }
static int run_add_address(void *a, const void *ctx) { (void)ctx; return cmd_address(a, true); }
static int run_del_address(void *a, const void *ctx) { (void)ctx; return cmd_address(a, false); }
static int run_add_session(void *a, const void *ctx) { (void)ctx; return cmd_add_session(a); }
static int run_del_session(void *a, const void *ctx) { (void)ctx; return cmd_del_session(a); }
static int run_set_err_est(void *a, const void *ctx) { (void)ctx; return update_config(a, true); }
static int run_set_tai_offset(void *a, const void *ctx) { (void)ctx; return update_config(a, false); }

static int run_stats(void *args, const void *ctx)
{
	struct args *a = args;

	(void)ctx;
	if (!require_arg(a->pin_dir, "--pin-dir"))
		return EXIT_USAGE;
	return print_counters(a->pin_dir, "stamp_reflector_stats", reflector_counter_names,
			      REFL_NR_COUNTERS, a->json) ? EXIT_FAIL : EXIT_OK;
}

static int run_test_run(void *args, const void *ctx)
{
	struct args *a = args;

	(void)ctx;
	if (!require_arg(a->pin_dir, "--pin-dir") || !require_arg(a->hex, "--hex"))
		return EXIT_USAGE;
	return test_run_pinned(a->pin_dir, a->hex, a->repeat) ? EXIT_FAIL : EXIT_OK;
}

/* detach, attach-dev, detach-dev, chain: the XDP chain's member commands (loader_util.c) */
static int run_member(const char *cmd, void *args)
{
	struct args *a = args;

	return member_subcommand(cmd, a->netns, a->dev, a->pin_dir, XDP_CHAIN_STAMP_REFLECTOR);
}

static int run_detach(void *a, const void *ctx) { (void)ctx; return run_member("detach", a); }
static int run_attach_dev(void *a, const void *ctx) { (void)ctx; return run_member("attach-dev", a); }
static int run_detach_dev(void *a, const void *ctx) { (void)ctx; return run_member("detach-dev", a); }
static int run_chain(void *a, const void *ctx) { (void)ctx; return run_member("chain", a); }

static const struct loader_cmd commands[] = {
	{"attach", run_attach},
	{"detach", run_detach},
	{"attach-dev", run_attach_dev},
	{"detach-dev", run_detach_dev},
	{"chain", run_chain},
	{"add-address", run_add_address},
	{"del-address", run_del_address},
	{"add-session", run_add_session},
	{"del-session", run_del_session},
	{"set-err-est", run_set_err_est},
	{"set-tai-offset", run_set_tai_offset},
	{"stats", run_stats},
	{"test-run", run_test_run},
	{NULL, NULL},
};

int main(int argc, char **argv)
{
	const char *cmd;
	struct args a;
	int rc;

	if (argc < 2) {
		usage(stderr);
		return EXIT_USAGE;
	}
	cmd = argv[1];
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
		usage(stdout);
		return EXIT_OK;
	}
	if (parse_args(argc - 1, argv + 1, &a))
		return EXIT_USAGE;

	rc = run_subcommand(commands, cmd, &a, NULL);
	if (rc < 0) {
		usage(stderr);
		return EXIT_USAGE;
	}
	return rc;
}
