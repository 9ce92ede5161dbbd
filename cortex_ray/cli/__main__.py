"""``python -m cortex_ray.cli``: the ``cortex-ray`` command line."""

from cortex_ray.cli import main

if __name__ == "__main__":
    main()
