"""Extract stage: index the verified archives (or an ImageFolder tree) into manifests and one label map."""
