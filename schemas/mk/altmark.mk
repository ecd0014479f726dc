# Alternate-marking block records (schemas/c/altmark_block.h): C test over
# schemas/vectors/altmark_block.json; `test_altmark --layouts` prints the struct layouts.
# Included from schemas/Makefile; OUT, CC, CFLAGS come from there.
#   make -C schemas test-altmark
ALTMARK_HEADERS := c/altmark_block.h c/batch_envelope.h tests/mini_json.h

all: $(OUT)/test_altmark

$(OUT)/test_altmark: tests/test_altmark.c $(ALTMARK_HEADERS) | $(OUT)
	$(CC) $(CFLAGS) -o $@ $<

.PHONY: test-altmark clean-altmark
test: test-altmark
test-altmark: $(OUT)/test_altmark
	$(OUT)/test_altmark vectors

clean: clean-altmark
clean-altmark:
	rm -f $(OUT)/test_altmark
