from distval.cli import main

main()
