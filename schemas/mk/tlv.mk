# STAMP TLV codecs (schemas/c/stamp_tlv*.h): C test over schemas/vectors/stamp_tlv*.json,
# plus an ASan/UBSan build that also fuzzes the decoders and the reflector rules.
# Included from schemas/Makefile; OUT, CC, CFLAGS come from there.
#   make -C schemas test-tlv      vectors (plain build) + vectors and 100k fuzz packets (sanitized build)
TLV_HEADERS   := $(wildcard c/stamp_tlv*.h)
TLV_SANITIZE  := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TLV_FUZZ_ITER ?= 100000
TLV_FUZZ_SEED ?= 7

all: $(OUT)/test_tlv_codecs $(OUT)/test_tlv_codecs_asan

$(OUT)/test_tlv_codecs: tests/test_tlv_codecs.c $(TLV_HEADERS) | $(OUT)
	$(CC) $(CFLAGS) -o $@ $<

$(OUT)/test_tlv_codecs_asan: tests/test_tlv_codecs.c $(TLV_HEADERS) | $(OUT)
	$(CC) -O1 -g -Wall -Wextra -Ic $(TLV_SANITIZE) -o $@ $<

.PHONY: test-tlv clean-tlv
test: test-tlv
test-tlv: $(OUT)/test_tlv_codecs $(OUT)/test_tlv_codecs_asan
	$(OUT)/test_tlv_codecs vectors
	$(OUT)/test_tlv_codecs_asan vectors
	$(OUT)/test_tlv_codecs_asan --fuzz $(TLV_FUZZ_ITER) $(TLV_FUZZ_SEED)

clean: clean-tlv
clean-tlv:
	rm -f $(OUT)/test_tlv_codecs $(OUT)/test_tlv_codecs_asan
