"""Make an ImageNet-shaped ImageFolder tree (hvdtrain/tasks/image_tree.py) to train or measure with:

    python scripts/make_image_tree.py /data/shapes --classes 100 --train-per-class 50
    hvdtrain recipe=resnet50_imagenet data.root=/data/shapes model.num_classes=100
"""

import argparse
import time

from hvdtrain.tasks.image_tree import make_image_tree


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="where to write train/ and val/")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train-per-class", type=int, default=100)
    parser.add_argument("--val-per-class", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    began = time.perf_counter()
    counts = make_image_tree(args.root, args.classes, args.train_per_class, args.val_per_class, args.seed)
    print(f"{args.root}: {counts['train']} training and {counts['val']} validation images of {args.classes} classes "
          f"in {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
