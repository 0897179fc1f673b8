"""Inversion attacks a semi-honest server can mount on each mechanism's releases.

Planned (DESIGN §6): learned decoder inversion and optimisation inversion,
scored with PSNR/SSIM against null reconstructions. Depends on :mod:`privfed`
and :mod:`mechanisms`; nothing depends on it but the CLI.
"""
