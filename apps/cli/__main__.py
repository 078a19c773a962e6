from threadweaver.cli import main

main()
