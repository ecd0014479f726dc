# In-line IOAM (schemas/c/ioam_*.h, ipv6_options.h): C test over schemas/vectors/ioam_batch_*,
# ioam_trace_option.json, ioam_e2e_option.json (make_ioam_vectors.py); `test_ioam --layouts`
# prints the struct layouts. Included from schemas/Makefile; OUT, CC, CFLAGS come from there.
#   make -C schemas test-ioam
IOAM_HEADERS := c/ioam_batch.h c/ioam_record.h c/ioam_trace_option.h c/ioam_e2e_option.h c/ipv6_options.h \
		c/batch_envelope.h tests/mini_json.h

all: $(OUT)/test_ioam

$(OUT)/test_ioam: tests/test_ioam.c $(IOAM_HEADERS) | $(OUT)
	$(CC) $(CFLAGS) -o $@ $<

.PHONY: test-ioam clean-ioam
test: test-ioam
test-ioam: $(OUT)/test_ioam
	$(OUT)/test_ioam vectors

clean: clean-ioam
clean-ioam:
	rm -f $(OUT)/test_ioam
