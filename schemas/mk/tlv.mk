# STAMP TLV codecs (schemas/c/stamp_tlv*.h): C test over schemas/vectors/stamp_tlv*.json.
# Included from schemas/Makefile; OUT, CC, CFLAGS come from there.
TLV_HEADERS := $(wildcard c/stamp_tlv*.h)

all: $(OUT)/test_tlv_codecs

$(OUT)/test_tlv_codecs: tests/test_tlv_codecs.c $(TLV_HEADERS) | $(OUT)
	$(CC) $(CFLAGS) -o $@ $<

.PHONY: test-tlv
test: test-tlv
test-tlv: $(OUT)/test_tlv_codecs
	$(OUT)/test_tlv_codecs vectors

clean: clean-tlv
.PHONY: clean-tlv
clean-tlv:
	rm -f $(OUT)/test_tlv_codecs
