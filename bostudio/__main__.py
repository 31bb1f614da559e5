from bostudio.cli import main

raise SystemExit(main())
