"""Acquire: the download and verify stages. The built-in sample, resumable transfers, MD5s computed once.

Cut by role, imports pointing down only: the acquire core (remote, fetch, local, md5state, space, obtain: one archive
brought into paths.raw, hashed once, the free space checked) imports nothing of ImageNet-21k's variant (archive21k),
which builds on it; the stages' plans (download, verify) choose the variant and sit above both."""
