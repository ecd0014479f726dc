/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * Flow commands shared by ioam_tx.c and ioam_lwt.c (ioam_tx_flows.c): the same maps (ioam_tx_flows,
 * ioam_if_ids, ioam_tx_config) in each program's pin directory. ctx = the struct ioam_prog.
 */
#ifndef SEGSCOPE_IOAM_TX_FLOWS_H
#define SEGSCOPE_IOAM_TX_FLOWS_H

#include "ioam_loader.h"

/* "PFX/LEN" -> masked prefix and mask; false after a message naming the flag. */
bool ioam_parse_prefix(const char *flag, const char *text, __u8 addr[16], __u8 mask[16], __u8 *len_out);
int ioam_tx_write_config(int fd, const struct ioam_args *a);   /* TAI-UTC into ioam_tx_config */
int ioam_tx_add_flow(void *args, const void *prog);
int ioam_tx_del_flow(void *args, const void *prog);
int ioam_tx_list_flows(void *args, const void *prog);
int ioam_tx_set_if_id(void *args, const void *prog);
int ioam_tx_set_tai_offset(void *args, const void *prog);

#endif /* SEGSCOPE_IOAM_TX_FLOWS_H */
