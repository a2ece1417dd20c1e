"""Checks a PNG file independently of the code that wrote it: signature, every chunk's CRC,
the IHDR size, and that the image data decompresses to the expected number of bytes.
Usage: check_png.py FILE [WIDTH HEIGHT]"""
import struct, sys, zlib

data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "FAIL: not a PNG signature"
at, idat, width = 8, b"", None
while at < len(data):
    (length,) = struct.unpack(">I", data[at:at + 4])
    kind, body = data[at + 4:at + 8], data[at + 8:at + 8 + length]
    (crc,) = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
    assert zlib.crc32(kind + body) & 0xFFFFFFFF == crc, "FAIL: bad CRC in chunk %r" % kind
    if kind == b"IHDR":
        width, height, depth, colour = struct.unpack(">IIBB", body[:10])
    if kind == b"IDAT":
        idat += body
    at += 12 + length
    if kind == b"IEND":
        break
assert width is not None and idat, "FAIL: no IHDR or no image data"
channels = {0: 1, 2: 3, 4: 2, 6: 4, 3: 1}[colour]
expected = height * (1 + width * channels * depth // 8)
assert len(zlib.decompress(idat)) == expected, "FAIL: image data does not decompress to %d bytes" % expected
if len(sys.argv) == 4:
    assert (width, height) == (int(sys.argv[2]), int(sys.argv[3])), "FAIL: size %dx%d" % (width, height)
print("valid PNG %dx%d, %d-bit, colour type %d" % (width, height, depth, colour))
