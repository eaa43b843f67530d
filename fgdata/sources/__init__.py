"""Where samples come from: folders, manifests, the CIFAR-10 tarball, the ImageNet tree, existing shards."""
