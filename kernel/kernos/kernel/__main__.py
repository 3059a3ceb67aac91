"""Start a Kernos kernel: ``python -m kernos.kernel -f CONNECTION_FILE``."""

from kernos.kernel.app import main

if __name__ == "__main__":
    main()
