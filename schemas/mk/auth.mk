# schemas/mk/auth.mk: STAMP base wire formats (timestamps, Error
# Estimate, authenticated packets, HMAC). Included by schemas/Makefile.
#   make -C schemas test-stamp-base     build and run build/schemas/test_stamp_base
STAMP_BASE_HEADERS := c/stamp_timestamp.h c/stamp_error_estimate.h c/stamp_auth_packet.h \
                      c/stamp_hmac.h c/stamp_test_packet.h tests/mini_json.h

.PHONY: test-stamp-base
all: $(OUT)/test_stamp_base
test: test-stamp-base

$(OUT)/test_stamp_base: tests/test_stamp_base.c $(STAMP_BASE_HEADERS) | $(OUT)
	$(CC) $(CFLAGS) -o $@ $<

test-stamp-base: $(OUT)/test_stamp_base
	$(OUT)/test_stamp_base vectors

# BPF object proving the codecs load and agree in the kernel (tests/schemas/test_stamp_base_bpf.py)
BPF_CLANG ?= clang
BPF_ARCH_INC ?= /usr/include/$(shell uname -m)-linux-gnu
all: $(OUT)/stamp_base_check.bpf.o
$(OUT)/stamp_base_check.bpf.o: tests/stamp_base_check.bpf.c $(STAMP_BASE_HEADERS) | $(OUT)
	$(BPF_CLANG) -target bpf -O2 -g -Wall -Ic -I$(BPF_ARCH_INC) -c $< -o $@

.PHONY: clean-stamp-base
clean: clean-stamp-base
clean-stamp-base:
	rm -f $(OUT)/test_stamp_base $(OUT)/stamp_base_check.bpf.o
