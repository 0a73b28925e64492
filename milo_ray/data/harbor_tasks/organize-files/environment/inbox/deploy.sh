# content of deploy.sh
