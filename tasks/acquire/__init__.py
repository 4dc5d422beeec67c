"""Acquire: the download and verify stages. The built-in sample, resumable transfers, MD5s computed once."""
