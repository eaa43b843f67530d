"""FID reference statistics of the prepared datasets, in the files EDM and EDM2 training code reads.

:func:`fgdata.fid.refs.compute_refs` runs the pass through the job core's one driver as the job definition
:class:`fgdata.fid.refs.RefsJob` (chunks are its units: resumable, split over torchrun ranks);
:mod:`fgdata.fid.detectors` loads Inception-v3 and DINOv2 without unpickling; :mod:`fgdata.fid.stats` holds
the float64 moments, the two file formats and the Fréchet distance. Importing this package loads no torch.
"""
