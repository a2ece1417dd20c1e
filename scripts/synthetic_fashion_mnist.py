#!/usr/bin/env python3
"""Writes synthetic images in Fashion-MNIST's idx format, for a machine without the data set.

    synthetic_fashion_mnist.py DIR [--train N] [--test N] [--seed S]

DIR (created if needed) gets train-images-idx3-ubyte, train-labels-idx1-ubyte,
t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, uncompressed, as the examples' --data-dir reads
them (examples/common/fashion_mnist.cpp). Each 28 x 28 image is dim noise with one bright vertical
bar whose column is its label (10 classes), so a classifier learns it within an epoch. The same seed
writes the same bytes. The standard library only: the GPU machine's python3 may have nothing else
(scripts/device-check.sh makes its streaming row's data with it). Exits 2 on a bad argument, 1
when DIR cannot be written.
"""

import argparse
import os
import random
import struct
import sys

SIDE = 28
CLASSES = 10
DIM = bytes(value >> 2 for value in range(256))  # noise in 0-63: the bar (255) stands out


def positive(text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError("%r: give a whole number of images, 1 or more" % text)
    return value


def write_split(directory, prefix, count, rng):
    images = bytearray(struct.pack(">IIII", 2051, count, SIDE, SIDE))
    labels = bytearray(struct.pack(">II", 2049, count))
    for _ in range(count):
        label = rng.randrange(CLASSES)
        image = bytearray(rng.randbytes(SIDE * SIDE).translate(DIM))
        column = 4 + 2 * label
        for row in range(SIDE):
            image[row * SIDE + column:row * SIDE + column + 2] = b"\xff\xff"
        images += image
        labels.append(label)
    for name, data in (("images-idx3-ubyte", images), ("labels-idx1-ubyte", labels)):
        with open(os.path.join(directory, "%s-%s" % (prefix, name)), "wb") as file:
            file.write(data)


def main():
    parser = argparse.ArgumentParser(description="Write synthetic Fashion-MNIST-shaped idx files into DIR.")
    parser.add_argument("directory", metavar="DIR", help="folder for the four idx files (created if needed)")
    parser.add_argument("--train", type=positive, default=16384, help="training images (default 16384)")
    parser.add_argument("--test", type=positive, default=2048, help="test images (default 2048)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    args = parser.parse_args()
    try:
        os.makedirs(args.directory, exist_ok=True)
        rng = random.Random(args.seed)
        write_split(args.directory, "train", args.train, rng)
        write_split(args.directory, "t10k", args.test, rng)
    except OSError as error:
        print("synthetic_fashion_mnist.py: cannot write into %s: %s" % (args.directory, error), file=sys.stderr)
        return 1
    print("wrote %d training and %d test images (idx format) to %s" % (args.train, args.test, args.directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())
